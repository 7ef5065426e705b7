package logs

import (
	"log/slog"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/enum"
	"forgeyard.dev/transport/wire/postcard"
)

// LogEncoding is how the bytes of every frame of one log stream are encoded
// (§155). Postcard enum; the values are explicit and stable.
type LogEncoding uint32

// Log encodings.
const (
	// LogEncodingRaw frames carry the log bytes as they are.
	LogEncodingRaw LogEncoding = 0
	// LogEncodingFlate frames each carry one independent raw DEFLATE
	// (RFC 1951) chunk; see LogFrameV1.Payload.
	LogEncodingFlate LogEncoding = 1

	numLogEncodings = 2
)

// String returns the encoding's name (Raw, Flate), or LogEncoding(n) for an undefined value.
func (e LogEncoding) String() string { return enum.Name(logEncodingNames[:], e, "LogEncoding") }

var logEncodingNames = [...]string{LogEncodingRaw: "Raw", LogEncodingFlate: "Flate"}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (e LogEncoding) LogValue() slog.Value { return slog.StringValue(e.String()) }

// LogStreamHeaderV1 is the first message of an attempt's log stream (§83). It
// names the attempt and lease the stream belongs to, the sequence number of
// the first frame that follows, the encoding of every frame, and the epoch of
// the agent session registration that opened the stream (a resume under a
// different epoch forces a full resync).
//
//	struct LogStreamHeaderV1 {
//	    attempt: [u8;16], lease: [u8;16], first_seq: u64,
//	    encoding: LogEncoding,   // Raw=0, Flate=1
//	    epoch: u64,
//	}
type LogStreamHeaderV1 struct {
	Attempt  wire.JobAttemptId
	Lease    wire.LeaseId
	FirstSeq uint64
	Encoding LogEncoding
	Epoch    uint64
}

// MessageType implements wire.Message.
func (*LogStreamHeaderV1) MessageType() wire.MessageTypeId { return MsgLogStreamHeader }

// AppendPostcard implements wire.Message.
func (m *LogStreamHeaderV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Attempt.ULID[:]...)
	b = append(b, m.Lease.ULID[:]...)
	b = postcard.AppendU64(b, m.FirstSeq)
	b = postcard.AppendVariant(b, uint32(m.Encoding))
	return postcard.AppendU64(b, m.Epoch)
}

// DecodePostcard implements wire.Message.
func (m *LogStreamHeaderV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Attempt.ULID)
	wire.ReadULID(d, &m.Lease.ULID)
	m.FirstSeq = d.U64()
	m.Encoding = LogEncoding(d.Variant(numLogEncodings))
	m.Epoch = d.U64()
}

// Validate implements wire.Message: attempt and lease are required and the
// encoding must be known.
func (m *LogStreamHeaderV1) Validate() error {
	if m.Attempt.IsZero() || m.Lease.IsZero() {
		return errInvalid("log stream header: attempt and lease are required")
	}
	if m.Encoding >= numLogEncodings {
		return errInvalid("log stream header: unknown encoding")
	}
	return nil
}
