package logs

import (
	"bytes"
	"compress/flate"
	"errors"
	"math"
	"reflect"
	"testing"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/sample"
	"forgeyard.dev/transport/wire/postcard"
)

const (
	testFamily = wire.FamilyLogs
	testPrefix = "logs."
)

var (
	tAttempt = wire.JobAttemptId{ULID: sample.ULID(1)}
	tLease   = wire.LeaseId{ULID: sample.ULID(2)}
)

func badEncodings() []badEncoding {
	return []badEncoding{
		{"header encoding", &LogStreamHeaderV1{Attempt: tAttempt, Lease: tLease, Encoding: numLogEncodings}, postcard.ErrBadEnum},
		{"frame stream kind", &LogFrameV1{Stream: numLogStreamKinds}, postcard.ErrBadEnum},
		{"frame uncompressed_len", &LogFrameV1{UncompressedLen: MaxLogChunk + 1}, postcard.ErrLengthOverBound},
		{"frame bytes", &LogFrameV1{UncompressedLen: 1, Bytes: make([]byte, MaxLogChunk+1)}, postcard.ErrLengthOverBound},
	}
}

func invalidMessages() []invalidMessage {
	return []invalidMessage{
		{"header zero attempt", &LogStreamHeaderV1{Lease: tLease}},
		{"header zero lease", &LogStreamHeaderV1{Attempt: tAttempt}},
		{"header encoding", &LogStreamHeaderV1{Attempt: tAttempt, Lease: tLease, Encoding: 7}},
		{"frame stream kind", &LogFrameV1{Stream: 3}},
		{"frame uncompressed_len", &LogFrameV1{UncompressedLen: MaxLogChunk + 1}},
		{"frame bytes", &LogFrameV1{Bytes: make([]byte, MaxLogChunk+1)}},
		{"resume zero attempt", &LogResumeRequestV1{FromSeq: 1}},
		{"ack zero attempt", &LogAckV1{DurableSeq: 1}},
		{"finalized zero attempt", &LogsFinalizedV1{Lease: tLease}},
		{"finalized zero lease", &LogsFinalizedV1{Attempt: tAttempt}},
		{"finalized dropped bytes without frames", &LogsFinalizedV1{Attempt: tAttempt, Lease: tLease, TotalBytes: 10, DroppedBytes: 1}},
		{"finalized dropped above total", &LogsFinalizedV1{Attempt: tAttempt, Lease: tLease, TotalBytes: 1, DroppedFrames: 1, DroppedBytes: 2}},
		{"finalized ack zero attempt", &LogsFinalizedAckV1{LastSeq: 1}},
	}
}

func maximalMessages() []wire.Message {
	const u64 = math.MaxUint64
	return []wire.Message{
		&LogStreamHeaderV1{Attempt: tAttempt, Lease: tLease, FirstSeq: u64, Encoding: LogEncodingFlate, Epoch: u64},
		&LogFrameV1{Seq: u64, Stream: LogSystem, TimestampMs: u64, UncompressedLen: MaxLogChunk, Bytes: bytes.Repeat([]byte{'x'}, MaxLogChunk)},
		&LogResumeRequestV1{Attempt: tAttempt, FromSeq: u64},
		&LogAckV1{Attempt: tAttempt, DurableSeq: u64},
		&LogsFinalizedV1{Attempt: tAttempt, Lease: tLease, LastSeq: u64, TotalBytes: u64, DroppedFrames: u64, DroppedBytes: u64},
		&LogsFinalizedAckV1{Attempt: tAttempt, LastSeq: u64},
	}
}

func TestEnumStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{LogEncodingRaw.String(), "Raw"}, {LogEncodingFlate.String(), "Flate"}, {LogEncoding(9).String(), "LogEncoding(9)"},
		{LogStdout.String(), "Stdout"}, {LogStderr.String(), "Stderr"}, {LogSystem.String(), "System"},
		{LogStreamKind(3).String(), "LogStreamKind(3)"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// Decoding a frame neither copies nor allocates: Bytes aliases the input.
func TestFrameDecodeAliasesAndDoesNotAllocate(t *testing.T) {
	body := (&LogFrameV1{Seq: 7, UncompressedLen: 5, Bytes: []byte("hello")}).AppendPostcard(nil)
	var f LogFrameV1
	var d postcard.Decoder
	if n := testing.AllocsPerRun(100, func() {
		d.Reset(body)
		f.DecodePostcard(&d)
	}); n != 0 {
		t.Fatalf("decode allocates %.1f times", n)
	}
	if err := d.Finish(); err != nil || string(f.Bytes) != "hello" {
		t.Fatalf("decode: %v %q", err, f.Bytes)
	}
	if &f.Bytes[0] != &body[len(body)-5] {
		t.Fatal("Bytes does not alias the frame buffer")
	}
	if cap(f.Bytes) != len(f.Bytes) {
		t.Fatal("aliased Bytes must not expose the rest of the buffer to append")
	}
}

func deflate(t *testing.T, p []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := flate.NewWriter(&buf, flate.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(p); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestPayload(t *testing.T) {
	text := bytes.Repeat([]byte("compiling package forgeyard.dev/transport/wire\n"), 100)
	flated := deflate(t, text)
	for _, tc := range []struct {
		name   string
		enc    LogEncoding
		f      LogFrameV1
		want   []byte
		reason PayloadReason
	}{
		{"raw", LogEncodingRaw, LogFrameV1{UncompressedLen: 5, Bytes: []byte("hello")}, []byte("hello"), 0},
		{"raw empty", LogEncodingRaw, LogFrameV1{}, nil, 0},
		{"flate", LogEncodingFlate, LogFrameV1{UncompressedLen: uint32(len(text)), Bytes: flated}, text, 0},
		{"flate sample", LogEncodingFlate, LogFrameV1{UncompressedLen: uint32(len(sampleFlateText)), Bytes: sampleFlateChunk}, []byte(sampleFlateText), 0},
		{"raw length mismatch", LogEncodingRaw, LogFrameV1{UncompressedLen: 4, Bytes: []byte("hello")}, nil, PayloadLengthMismatch},
		{"flate shorter than declared", LogEncodingFlate, LogFrameV1{UncompressedLen: uint32(len(text)) + 1, Bytes: flated}, nil, PayloadLengthMismatch},
		{"flate longer than declared", LogEncodingFlate, LogFrameV1{UncompressedLen: uint32(len(text)) - 1, Bytes: flated}, nil, PayloadOverflow},
		{"flate truncated", LogEncodingFlate, LogFrameV1{UncompressedLen: uint32(len(text)), Bytes: flated[:len(flated)/2]}, nil, PayloadCorrupt},
		{"flate garbage", LogEncodingFlate, LogFrameV1{UncompressedLen: 10, Bytes: []byte{0xff, 0xff, 0xff, 0xff}}, nil, PayloadCorrupt},
		{"declared over bound", LogEncodingRaw, LogFrameV1{UncompressedLen: MaxLogChunk + 1}, nil, PayloadOverBound},
		{"unknown encoding", 2, LogFrameV1{UncompressedLen: 5, Bytes: []byte("hello")}, nil, PayloadUnknownEncoding},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := []byte("prefix:")
			got, err := tc.f.Payload(tc.enc, dst)
			if tc.reason == 0 {
				if err != nil || !bytes.Equal(got, append([]byte("prefix:"), tc.want...)) {
					t.Fatalf("got %q, %v", got, err)
				}
				return
			}
			var pe *PayloadError
			if !errors.As(err, &pe) || pe.Reason != tc.reason {
				t.Fatalf("got %v, want a *PayloadError with reason %v", err, tc.reason)
			}
			if string(got) != "prefix:" {
				t.Fatalf("on error dst must be returned unchanged, got %q", got)
			}
		})
	}
}

// A compression bomb: 1 MiB of zeros compressed into a frame that claims
// 64 KiB. Payload fails with PayloadOverflow after producing at most
// MaxLogChunk+1 bytes, and the frame itself passes every wire check.
func TestPayloadCompressionBomb(t *testing.T) {
	bomb := deflate(t, make([]byte, 1<<20))
	if len(bomb) > MaxLogChunk {
		t.Fatalf("bomb of %d bytes does not fit a frame", len(bomb))
	}
	f := &LogFrameV1{Seq: 1, UncompressedLen: MaxLogChunk, Bytes: bomb}
	body := f.AppendPostcard(nil)
	got, err := decodeBody(t, MsgLogFrame, body)
	if err != nil || got.Validate() != nil {
		t.Fatalf("the bomb frame is well-formed on the wire: %v", err)
	}
	out, err := got.(*LogFrameV1).Payload(LogEncodingFlate, nil)
	var pe *PayloadError
	if !errors.As(err, &pe) || pe.Reason != PayloadOverflow {
		t.Fatalf("got %v, want PayloadOverflow", err)
	}
	if pe.Produced > MaxLogChunk+1 || out != nil {
		t.Fatalf("produced %d bytes (limit %d), returned %d", pe.Produced, MaxLogChunk+1, len(out))
	}
	if cap(out) > 0 {
		t.Fatal("returned a buffer on error")
	}
}

func TestPayloadReusesDst(t *testing.T) {
	f := &LogFrameV1{UncompressedLen: uint32(len(sampleFlateText)), Bytes: sampleFlateChunk}
	dst := make([]byte, 0, MaxLogChunk+1)
	f.Payload(LogEncodingFlate, dst) // warm the reader pool
	n := testing.AllocsPerRun(50, func() {
		if out, err := f.Payload(LogEncodingFlate, dst); err != nil || string(out) != sampleFlateText {
			t.Fatalf("got %q, %v", out, err)
		}
	})
	if raceEnabled {
		t.Logf("race detector on: sync.Pool drops readers; %.1f allocs not asserted", n)
		return
	}
	if n != 0 {
		t.Fatalf("Payload with a large enough dst allocates %.1f times", n)
	}
}

// FuzzFramePayload: any frame body either fails to decode with a typed error
// or decodes to a frame whose Payload, under either encoding, never panics
// and never yields more than UncompressedLen ≤ MaxLogChunk bytes.
func FuzzFramePayload(f *testing.F) {
	for _, m := range Samples() {
		if fr, ok := m.(*LogFrameV1); ok {
			f.Add(fr.AppendPostcard(nil))
		}
	}
	f.Add((&LogFrameV1{UncompressedLen: 16, Bytes: []byte{0x4b, 0x4c, 0x44, 0x05, 0x00}}).AppendPostcard(nil))
	f.Fuzz(func(t *testing.T, body []byte) {
		var fr LogFrameV1
		d := postcard.NewDecoder(body)
		fr.DecodePostcard(&d)
		if err := d.Finish(); err != nil {
			var pe *postcard.Error
			if !errors.As(err, &pe) {
				t.Fatalf("untyped decode error %v", err)
			}
			return
		}
		// Postcard accepts non-canonical varints, so compare values, not bytes.
		var again LogFrameV1
		d = postcard.NewDecoder(fr.AppendPostcard(nil))
		again.DecodePostcard(&d)
		if err := d.Finish(); err != nil || !reflect.DeepEqual(again, fr) {
			t.Fatalf("re-encoded frame decodes to %+v, %v; want %+v", again, err, fr)
		}
		for _, enc := range []LogEncoding{LogEncodingRaw, LogEncodingFlate} {
			out, err := fr.Payload(enc, nil)
			if err != nil {
				var pe *PayloadError
				if !errors.As(err, &pe) || pe.Produced > int(fr.UncompressedLen)+1 {
					t.Fatalf("%v: %v", enc, err)
				}
				continue
			}
			if len(out) != int(fr.UncompressedLen) {
				t.Fatalf("%v: payload %d bytes, declared %d", enc, len(out), fr.UncompressedLen)
			}
		}
	})
}

func BenchmarkFrameAppend(b *testing.B) {
	f := &LogFrameV1{Seq: 1 << 20, Stream: LogStdout, TimestampMs: 1767225600000, UncompressedLen: 4096, Bytes: make([]byte, 4096)}
	buf := make([]byte, 0, MaxLogFrameSize)
	b.SetBytes(4096)
	b.ReportAllocs()
	for b.Loop() {
		buf = f.AppendPostcard(buf[:0])
	}
}

func BenchmarkFrameDecode(b *testing.B) {
	body := (&LogFrameV1{Seq: 1 << 20, Stream: LogStdout, TimestampMs: 1767225600000, UncompressedLen: 4096, Bytes: make([]byte, 4096)}).AppendPostcard(nil)
	var f LogFrameV1
	var d postcard.Decoder
	b.SetBytes(4096)
	b.ReportAllocs()
	for b.Loop() {
		d.Reset(body)
		f.DecodePostcard(&d)
	}
}

func BenchmarkPayloadFlate(b *testing.B) {
	text := bytes.Repeat([]byte("compiling package forgeyard.dev/transport/wire\n"), 64<<10/48)
	var buf bytes.Buffer
	w, _ := flate.NewWriter(&buf, flate.DefaultCompression)
	w.Write(text)
	w.Close()
	f := &LogFrameV1{UncompressedLen: uint32(len(text)), Bytes: buf.Bytes()}
	dst := make([]byte, 0, MaxLogChunk+1)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := f.Payload(LogEncodingFlate, dst); err != nil {
			b.Fatal(err)
		}
	}
}
