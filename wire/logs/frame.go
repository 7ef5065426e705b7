package logs

import (
	"bytes"
	"compress/flate"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/enum"
	"forgeyard.dev/transport/wire/postcard"
)

// MaxLogChunk bounds both the encoded bytes of one log frame and the size its
// payload decompresses to (§154), in bytes.
const MaxLogChunk = 64 << 10

// LogStreamKind names the output a log frame came from. Postcard enum.
type LogStreamKind uint32

// Log stream kinds.
const (
	LogStdout LogStreamKind = 0 // the job's standard output
	LogStderr LogStreamKind = 1 // the job's standard error
	LogSystem LogStreamKind = 2 // messages of the agent itself about the attempt

	numLogStreamKinds = 3
)

// String returns Stdout, Stderr or System.
func (k LogStreamKind) String() string { return enum.Name(logStreamKindNames[:], k, "LogStreamKind") }

var logStreamKindNames = [...]string{LogStdout: "Stdout", LogStderr: "Stderr", LogSystem: "System"}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (k LogStreamKind) LogValue() slog.Value { return slog.StringValue(k.String()) }

// LogFrameV1 is one chunk of an attempt's log (§84). Frames of one stream
// carry consecutive sequence numbers (§85).
//
//	struct LogFrameV1 {
//	    seq: u64,
//	    stream: LogStreamKind,      // Stdout=0, Stderr=1, System=2
//	    timestamp_ms: u64,          // unix milliseconds when the chunk was read
//	    uncompressed_len: u32,      // ≤ MaxLogChunk (65536), checked while decoding
//	    bytes: Bytes,               // ≤ MaxLogChunk; encoded per the stream's LogEncoding
//	}
//
// Aliasing: DecodePostcard does not copy the chunk. After decoding, Bytes
// aliases the decoder's input (the frame buffer) and is valid only as long as
// that buffer is; a caller that keeps the chunk past the next read must copy
// it (or call Payload, which always writes into the caller's dst).
type LogFrameV1 struct {
	Seq             uint64
	Stream          LogStreamKind
	TimestampMs     uint64
	UncompressedLen uint32
	Bytes           []byte
}

// MessageType implements wire.Message.
func (*LogFrameV1) MessageType() wire.MessageTypeId { return MsgLogFrame }

// AppendPostcard implements wire.Message.
func (m *LogFrameV1) AppendPostcard(b []byte) []byte {
	return append((*frameHead)(m).AppendPostcard(b), m.Bytes...) // the head ends with the chunk's length
}

// frameHead encodes a LogFrameV1 without the chunk bytes themselves: every
// field, then the chunk's length prefix. The chunk is the last thing in the
// message, so head ‖ chunk is the full encoding.
type frameHead LogFrameV1

func (*frameHead) MessageType() wire.MessageTypeId { return MsgLogFrame }
func (h *frameHead) AppendPostcard(b []byte) []byte {
	b = postcard.AppendU64(b, h.Seq)
	b = postcard.AppendVariant(b, uint32(h.Stream))
	b = postcard.AppendU64(b, h.TimestampMs)
	b = postcard.AppendU32(b, h.UncompressedLen)
	return postcard.AppendLen(b, len(h.Bytes))
}
func (h *frameHead) DecodePostcard(d *postcard.Decoder) {
	d.Fail(postcard.CodeInvalidValue, "frame head is encode-only")
}
func (h *frameHead) Validate() error { return (*LogFrameV1)(h).Validate() }

// AppendFrameHead appends the frame that carries env with m as its payload,
// except the chunk bytes: the frame on the wire is the returned buffer
// followed by m.Bytes, written as a second (vectored) write. Nothing of the
// chunk is copied, which is how log streams send 64 KiB chunks. env.Payload
// is ignored. The frame (head plus chunk) must fit limit.
func AppendFrameHead(b []byte, limit int, env *wire.Envelope, m *LogFrameV1) ([]byte, error) {
	e := *env
	e.Payload = (*frameHead)(m)
	return wire.AppendFrameHead(b, limit, len(m.Bytes), e.AppendPostcard)
}

// DecodePostcard implements wire.Message. It allocates nothing: Bytes
// aliases the input (see the type's comment) and is nil when empty. An
// uncompressed_len above MaxLogChunk fails with postcard.ErrLengthOverBound.
func (m *LogFrameV1) DecodePostcard(d *postcard.Decoder) {
	m.Seq = d.U64()
	m.Stream = LogStreamKind(d.Variant(numLogStreamKinds))
	m.TimestampMs = d.U64()
	m.UncompressedLen = d.U32()
	if m.UncompressedLen > MaxLogChunk {
		d.Fail(postcard.CodeLengthOverBound, "uncompressed_len > MaxLogChunk")
		m.UncompressedLen = 0
	}
	m.Bytes = d.BytesRef(MaxLogChunk)
	if len(m.Bytes) == 0 {
		m.Bytes = nil
	}
}

// Validate implements wire.Message: the stream kind must be known and both
// lengths within MaxLogChunk. Whether UncompressedLen matches the bytes
// depends on the stream's encoding; Payload checks it.
func (m *LogFrameV1) Validate() error {
	if m.Stream >= numLogStreamKinds {
		return errInvalid("log frame: unknown stream kind")
	}
	if m.UncompressedLen > MaxLogChunk || len(m.Bytes) > MaxLogChunk {
		return errInvalid("log frame: chunk above MaxLogChunk")
	}
	return nil
}

// PayloadReason classifies a PayloadError.
type PayloadReason uint8

// Payload failure reasons.
const (
	// PayloadOverBound: UncompressedLen or the encoded chunk exceeds MaxLogChunk.
	PayloadOverBound PayloadReason = 1
	// PayloadLengthMismatch: a raw chunk's length differs from
	// UncompressedLen, or a compressed chunk decompressed to fewer bytes.
	PayloadLengthMismatch PayloadReason = 2
	// PayloadOverflow: a compressed chunk decompresses to more than
	// UncompressedLen bytes (a compression bomb, §154). Decompression stops
	// after UncompressedLen+1 bytes of output.
	PayloadOverflow PayloadReason = 3
	// PayloadCorrupt: the compressed chunk is not valid DEFLATE data.
	PayloadCorrupt PayloadReason = 4
	// PayloadUnknownEncoding: the encoding is not a LogEncoding this build knows.
	PayloadUnknownEncoding PayloadReason = 5
)

// String describes the reason in words, as used in PayloadError's message.
func (r PayloadReason) String() string { return enum.Name(payloadReasonNames[:], r, "PayloadReason") }

var payloadReasonNames = [...]string{
	PayloadOverBound:       "over bound",
	PayloadLengthMismatch:  "length mismatch",
	PayloadOverflow:        "decompressed size exceeds declared length",
	PayloadCorrupt:         "corrupt compressed data",
	PayloadUnknownEncoding: "unknown encoding",
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (r PayloadReason) LogValue() slog.Value { return slog.StringValue(r.String()) }

// PayloadError is returned by LogFrameV1.Payload.
type PayloadError struct {
	Reason   PayloadReason
	Declared uint32 // the frame's UncompressedLen
	Produced int    // bytes of output produced before the failure (≤ Declared+1)
	Err      error  // the decompressor's error for PayloadCorrupt, else nil
}

// Error gives the reason, the declared and produced lengths and, when present, the underlying error.
func (e *PayloadError) Error() string {
	s := "logs: frame payload: " + e.Reason.String() + " (declared " +
		strconv.FormatUint(uint64(e.Declared), 10) + ", produced " + strconv.Itoa(e.Produced) + ")"
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the decompressor's error, if any.
func (e *PayloadError) Unwrap() error { return e.Err }

// inflater is a pooled DEFLATE reader (its window is ~40 KiB; pooling keeps
// Payload from allocating it per frame).
type inflater struct {
	src bytes.Reader
	r   io.ReadCloser
}

var inflaters = sync.Pool{New: func() any {
	z := new(inflater)
	z.r = flate.NewReader(&z.src)
	return z
}}

// Payload appends the frame's uncompressed log bytes to dst and returns the
// extended slice; on error it returns dst unchanged (its spare capacity may
// have been written) and a *PayloadError. enc is the stream's encoding from
// its LogStreamHeaderV1.
//
// It never produces more than UncompressedLen (≤ MaxLogChunk) bytes: a Flate
// chunk is decompressed into at most UncompressedLen+1 bytes of output, and
// one byte more than declared fails with PayloadOverflow. Payload is safe for
// concurrent use on distinct frames.
func (f *LogFrameV1) Payload(enc LogEncoding, dst []byte) ([]byte, error) {
	n := int(f.UncompressedLen)
	if f.UncompressedLen > MaxLogChunk || len(f.Bytes) > MaxLogChunk {
		return dst, &PayloadError{Reason: PayloadOverBound, Declared: f.UncompressedLen}
	}
	switch enc {
	case LogEncodingRaw:
		if len(f.Bytes) != n {
			return dst, &PayloadError{Reason: PayloadLengthMismatch, Declared: f.UncompressedLen}
		}
		return append(dst, f.Bytes...), nil
	case LogEncodingFlate:
	default:
		return dst, &PayloadError{Reason: PayloadUnknownEncoding, Declared: f.UncompressedLen}
	}

	start := len(dst)
	grown := slices.Grow(dst, n+1)
	out := grown[start : start+n+1]
	z := inflaters.Get().(*inflater)
	defer inflaters.Put(z)
	z.src.Reset(f.Bytes)
	if err := z.r.(flate.Resetter).Reset(&z.src, nil); err != nil {
		return dst, &PayloadError{Reason: PayloadCorrupt, Declared: f.UncompressedLen, Err: err}
	}
	got := 0
	var err error
	// Each Read either produces output or returns an error, and out has
	// n+1 ≤ MaxLogChunk+1 bytes, so the loop is bounded.
	for got < len(out) && err == nil {
		var k int
		k, err = z.r.Read(out[got:])
		got += k
	}
	switch {
	case got > n:
		return dst, &PayloadError{Reason: PayloadOverflow, Declared: f.UncompressedLen, Produced: got}
	case err != io.EOF:
		return dst, &PayloadError{Reason: PayloadCorrupt, Declared: f.UncompressedLen, Produced: got, Err: err}
	case got < n:
		return dst, &PayloadError{Reason: PayloadLengthMismatch, Declared: f.UncompressedLen, Produced: got}
	}
	return grown[:start+n], nil
}
