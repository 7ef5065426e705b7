package wire

import (
	"encoding/hex"

	"forgeyard.dev/transport/wire/postcard"
)

// TraceContext is a W3C trace context (traceparent) carried in the envelope
// so one trace spans daemon and agent (§211).
type TraceContext struct {
	TraceID [16]byte
	SpanID  [8]byte
	Flags   uint8
}

// Traceparent renders the W3C traceparent header value.
func (t TraceContext) Traceparent() string {
	return "00-" + hex.EncodeToString(t.TraceID[:]) + "-" + hex.EncodeToString(t.SpanID[:]) + "-" + hex.EncodeToString([]byte{t.Flags})
}

// Envelope wraps every message on a message stream (§30):
//
//	struct EnvelopeV1 {
//	    protocol: ProtocolVersion,
//	    message_id: [u8; 16],
//	    correlation_id: Option<[u8; 16]>,
//	    sent_at: u64,              // unix milliseconds, diagnostic only (§146)
//	    trace: Option<TraceContext>,
//	    payload: Payload,          // varint(family) varint(variant) body
//	}
type Envelope struct {
	Protocol       ProtocolVersion
	MessageID      MessageId
	HasCorrelation bool
	CorrelationID  CorrelationId
	SentAtMs       uint64
	HasTrace       bool
	Trace          TraceContext
	Payload        Message
}

// EnvelopeHeaderMaxSize bounds the encoded envelope fields before the payload.
const EnvelopeHeaderMaxSize = 3 + 3 + 16 + 1 + 16 + 10 + 1 + 25 + 10

// WithCorrelation sets the correlation id and returns e.
func (e *Envelope) WithCorrelation(c CorrelationId) *Envelope {
	e.HasCorrelation, e.CorrelationID = true, c
	return e
}

// AppendPostcard appends the envelope and its payload.
func (e *Envelope) AppendPostcard(b []byte) []byte {
	b = e.Protocol.AppendPostcard(b)
	b = AppendULID(b, e.MessageID.ULID)
	b = postcard.AppendOption(b, e.HasCorrelation)
	if e.HasCorrelation {
		b = AppendULID(b, e.CorrelationID.ULID)
	}
	b = postcard.AppendU64(b, e.SentAtMs)
	b = postcard.AppendOption(b, e.HasTrace)
	if e.HasTrace {
		b = append(b, e.Trace.TraceID[:]...)
		b = append(b, e.Trace.SpanID[:]...)
		b = append(b, e.Trace.Flags)
	}
	return AppendMessage(b, e.Payload)
}

// DecodeHeader reads the envelope fields that precede the payload.
func (e *Envelope) DecodeHeader(d *postcard.Decoder) {
	e.Protocol.DecodePostcard(d)
	ReadULID(d, &e.MessageID.ULID)
	e.HasCorrelation = d.Option()
	if e.HasCorrelation {
		ReadULID(d, &e.CorrelationID.ULID)
	}
	e.SentAtMs = d.U64()
	e.HasTrace = d.Option()
	if e.HasTrace {
		d.Array16(&e.Trace.TraceID)
		d.Fixed(e.Trace.SpanID[:])
		e.Trace.Flags = d.U8()
	}
}

// DecodeEnvelope decodes one complete envelope (a frame body) with the
// registry. Every byte of b must belong to the envelope. The returned
// payload does not alias b except where a message documents it.
func DecodeEnvelope(b []byte, r *Registry) (*Envelope, error) {
	var e Envelope
	if err := e.Decode(b, r); err != nil {
		return nil, err
	}
	return &e, nil
}

// Decode decodes b into e with the registry.
func (e *Envelope) Decode(b []byte, r *Registry) error {
	d := postcard.NewDecoder(b)
	e.DecodeHeader(&d)
	if err := d.Err(); err != nil {
		return err
	}
	m, err := r.DecodeMessage(&d)
	if err != nil {
		return err
	}
	e.Payload = m
	return nil
}
