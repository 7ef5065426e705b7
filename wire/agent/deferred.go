package agent

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/maxsize"
	"forgeyard.dev/transport/wire/postcard"
)

// MsgRegistrationDeferred is the MessageTypeId of RegistrationDeferredV1.
var MsgRegistrationDeferred = id(0x1c)

// MaxRetryAfterMs bounds RegistrationDeferredV1.retry_after_ms (10 minutes).
const MaxRetryAfterMs = 600_000

// RegistrationDeferredV1 answers a TransportHelloV1 or a RegisterAgentV1
// the daemon cannot admit now (admission control: its registration rate,
// its handshake or connection cap) with a structured retry hint: the agent
// closes this connection and must not connect to this daemon again before
// retry_after_ms has passed (it adds its own jitter on top). The daemon
// spreads the hints it hands out — each deferred agent gets its own slot,
// sized from the admission backlog and the registration rate, plus
// jitter — so a herd comes back at the rate it can be admitted instead of
// all at once.
//
//	struct RegistrationDeferredV1 {
//	    code: u16,                          // wire.ProtocolErrorCode: Overloaded, RateLimited, …
//	    retry_after_ms: u32,                // 1 ..= MaxRetryAfterMs (600000)
//	    message: String,                    // ≤ MaxRejectMessage (512) bytes, truncated on encode
//	}
//
// Compatibility (docs/protocols/internal/compatibility.md): a new message
// (variant 0x1c, since 1.2) gated by the feature RetryAfterV1. A daemon sends
// it only to an agent whose TransportHelloV1 advertised RetryAfterV1 (the
// daemon knows that before it answers the hello); every other agent gets
// RegistrationRejectedV1{code, RetryBackoff, message} as before, so old
// peers interoperate unchanged.
//
// Validate: non-zero code (unknown codes from a newer peer are accepted),
// retry_after_ms in 1..=MaxRetryAfterMs, safe message text.
type RegistrationDeferredV1 struct {
	Code         wire.ProtocolErrorCode
	RetryAfterMs uint32
	Message      string
}

const nameRegistrationDeferred = "agent.RegistrationDeferredV1"

// retry_after_ms ≤ MaxRetryAfterMs (600000 < 2²¹) takes at most 3 varint bytes.
var maxRegistrationDeferredSize = maxsize.U16 + 3 + maxsize.Bytes(MaxRejectMessage)

// MessageType implements wire.Message.
func (*RegistrationDeferredV1) MessageType() wire.MessageTypeId { return MsgRegistrationDeferred }

// AppendPostcard implements wire.Message.
func (m *RegistrationDeferredV1) AppendPostcard(b []byte) []byte {
	b = postcard.AppendU16(b, uint16(m.Code))
	b = postcard.AppendU32(b, m.RetryAfterMs)
	return postcard.AppendString(b, truncateText(m.Message, MaxRejectMessage))
}

// DecodePostcard implements wire.Message.
func (m *RegistrationDeferredV1) DecodePostcard(d *postcard.Decoder) {
	m.Code = wire.ProtocolErrorCode(d.U16())
	m.RetryAfterMs = d.U32()
	m.Message = d.String(MaxRejectMessage)
}

// Validate implements wire.Message.
func (m *RegistrationDeferredV1) Validate() error {
	const n = nameRegistrationDeferred
	switch {
	case m.Code == 0:
		return invalid(n, "code", "zero")
	case m.RetryAfterMs == 0:
		return invalid(n, "retry_after_ms", "zero")
	case m.RetryAfterMs > MaxRetryAfterMs:
		return invalid(n, "retry_after_ms", "above its bound")
	}
	return checkText(n, "message", m.Message)
}
