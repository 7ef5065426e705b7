package logs

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/sample"
)

// sampleFlateChunk is a raw DEFLATE (RFC 1951) chunk of sampleFlateText,
// fixed here so that the samples never depend on a compressor's output.
var sampleFlateChunk = []byte{
	0x2b, 0x2e, 0x49, 0x2d, 0x50, 0x30, 0xd2, 0x37, 0xb6, 0x52, 0x48, 0xce, 0xcf, 0x2d, 0xc8, 0xcc,
	0xc9, 0xcc, 0x4b, 0x57, 0x48, 0xcb, 0x2f, 0x4a, 0x4f, 0xad, 0x4c, 0x2c, 0x4a, 0x51, 0xd0, 0x48,
	0xcf, 0x57, 0x48, 0x2a, 0xcd, 0xcc, 0x49, 0x51, 0xd0, 0xd3, 0xd7, 0xd3, 0xd3, 0xd3, 0xe4, 0x2a,
	0xa6, 0xa9, 0x72, 0x00,
}

const sampleFlateLine = "step 2/3: compiling forgeyard (go build ./...)\n"

// sampleFlateText is what sampleFlateChunk decompresses to.
const sampleFlateText = sampleFlateLine + sampleFlateLine + sampleFlateLine

// Samples returns one deterministic, fully populated, valid instance of every
// logs message, plus extra instances so that every enum variant appears. Ids
// are fixed; nothing depends on the clock or randomness. Each call returns
// fresh values.
func Samples() []wire.Message {
	attempt := wire.JobAttemptId{ULID: sample.ULID(0x21)}
	lease := wire.LeaseId{ULID: sample.ULID(0x22)}
	const t0 = 1767225600000 // 2026-01-01T00:00:00Z in unix ms
	raw := []byte("2026-01-01T00:00:00Z starting job\n")
	return []wire.Message{
		&LogStreamHeaderV1{Attempt: attempt, Lease: lease, FirstSeq: 1, Encoding: LogEncodingRaw, Epoch: 3},
		&LogStreamHeaderV1{Attempt: attempt, Lease: lease, FirstSeq: 129, Encoding: LogEncodingFlate, Epoch: 4},
		&LogFrameV1{Seq: 1, Stream: LogStdout, TimestampMs: t0 + 1, UncompressedLen: uint32(len(raw)), Bytes: raw},
		&LogFrameV1{Seq: 2, Stream: LogStderr, TimestampMs: t0 + 2, UncompressedLen: 14, Bytes: []byte("warning: slow\n")},
		&LogFrameV1{Seq: 300, Stream: LogSystem, TimestampMs: t0 + 3, UncompressedLen: uint32(len(sampleFlateText)),
			Bytes: append([]byte(nil), sampleFlateChunk...)},
		&LogResumeRequestV1{Attempt: attempt, FromSeq: 129},
		&LogAckV1{Attempt: attempt, DurableSeq: 128},
		&LogsFinalizedV1{Attempt: attempt, Lease: lease, LastSeq: 300, TotalBytes: 1 << 20, DroppedFrames: 2, DroppedBytes: 8192},
		&LogsFinalizedAckV1{Attempt: attempt, LastSeq: 300},
	}
}
