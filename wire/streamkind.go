package wire

import (
	"log/slog"

	"forgeyard.dev/transport/wire/internal/enum"
	"forgeyard.dev/transport/wire/postcard"
)

// StreamKind identifies what a stream carries (§40). It is the first thing
// on every stream, in a StreamHeader. Values are stable enum discriminants.
type StreamKind uint8

// Stream kinds.
const (
	StreamControl     StreamKind = 0 // long-lived bidi control stream (§39)
	StreamHeartbeat   StreamKind = 1 // optional dedicated heartbeat stream (§42)
	StreamLog         StreamKind = 2 // one uni stream per attempt (§43)
	StreamCasUpload   StreamKind = 3 // one stream per object, agent → daemon
	StreamCasDownload StreamKind = 4 // one stream per object, daemon → agent
	StreamDiagnostic  StreamKind = 5 // health probes and diagnostics
	StreamDevice      StreamKind = 6 // device protocol family
	StreamSigning     StreamKind = 7 // signing protocol family
	StreamSecret      StreamKind = 8 // secret material for one leased attempt (§150)

	NumStreamKinds = 9
)

var streamKindNames = [NumStreamKinds]string{
	"control", "heartbeat", "log", "cas-upload", "cas-download", "diagnostic", "device", "signing", "secret",
}

// String returns the kind's name, or stream-kind(n) for a kind this build does not know.
func (k StreamKind) String() string { return enum.Name(streamKindNames[:], k, "stream-kind") }

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (k StreamKind) LogValue() slog.Value { return slog.StringValue(k.String()) }

// Valid reports whether k is a kind this build knows.
func (k StreamKind) Valid() bool { return k < NumStreamKinds }

// FrameLimit returns the maximum frame body size on streams of kind k.
func (k StreamKind) FrameLimit() int {
	switch k {
	case StreamLog:
		return MaxLogFrame
	case StreamCasUpload, StreamCasDownload:
		return MaxCasHeaderFrame
	default:
		return MaxControlFrame
	}
}

// StreamHeader opens every stream (§40), as one frame of at most
// MaxStreamHeaderFrame bytes:
//
//	struct StreamHeaderV1 { kind: StreamKind, version: ProtocolVersion }
//
// version is the family version the opener speaks on this stream. An unknown
// kind or a malformed header closes that stream only (§184).
type StreamHeader struct {
	Kind    StreamKind
	Version ProtocolVersion
}

// AppendPostcard appends h.
func (h *StreamHeader) AppendPostcard(b []byte) []byte {
	b = postcard.AppendVariant(b, uint32(h.Kind))
	return h.Version.AppendPostcard(b)
}

// DecodePostcard reads h; an unknown kind fails with CodeBadEnum.
func (h *StreamHeader) DecodePostcard(d *postcard.Decoder) {
	h.Kind = StreamKind(d.Variant(NumStreamKinds))
	h.Version.DecodePostcard(d)
}

// AppendStreamHeaderFrame appends h as a frame.
func AppendStreamHeaderFrame(b []byte, h StreamHeader) []byte {
	b, _ = AppendFrame(b, MaxStreamHeaderFrame, h.AppendPostcard)
	return b
}

// ParseStreamHeader decodes a StreamHeader frame body.
func ParseStreamHeader(body []byte) (StreamHeader, error) {
	var h StreamHeader
	d := postcard.NewDecoder(body)
	h.DecodePostcard(&d)
	return h, d.Finish()
}
