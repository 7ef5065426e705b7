package wire

import (
	"errors"
	"log/slog"

	"forgeyard.dev/transport/wire/internal/enum"
	"forgeyard.dev/transport/wire/postcard"
)

// ProtocolErrorCode is a stable code sent to a peer in a WireErrorV1
// (§262–265). Never renumber; add new codes at the end.
type ProtocolErrorCode uint16

// Protocol error codes.
const (
	ErrCodeMalformed          ProtocolErrorCode = 1  // frame or message failed to decode
	ErrCodeUnknownMessage     ProtocolErrorCode = 2  // message type not known to the receiver
	ErrCodeUnsupportedVersion ProtocolErrorCode = 3  // no common protocol version / policy minimum
	ErrCodeNotRegistered      ProtocolErrorCode = 4  // message requires a registered session
	ErrCodeInvalidState       ProtocolErrorCode = 5  // message not legal in the session's state
	ErrCodeRoleForbidden      ProtocolErrorCode = 6  // message family not allowed for the peer role
	ErrCodeRateLimited        ProtocolErrorCode = 7  // too many messages of this kind
	ErrCodeOverloaded         ProtocolErrorCode = 8  // admission control; try later or elsewhere
	ErrCodeFrameTooLarge      ProtocolErrorCode = 9  // frame above the stream kind's limit
	ErrCodeStaleLease         ProtocolErrorCode = 10 // lease expired, revoked or superseded
	ErrCodeStaleSession       ProtocolErrorCode = 11 // agent session is not the current one
	ErrCodeSessionFenced      ProtocolErrorCode = 12 // this transport lost control authority
	ErrCodeNotFound           ProtocolErrorCode = 13 // referenced object or attempt unknown
	ErrCodeForbidden          ProtocolErrorCode = 14 // not authorized for this lease/object
	ErrCodeInvalidValue       ProtocolErrorCode = 15 // decoded but failed validation
	ErrCodeTimeout            ProtocolErrorCode = 16 // request deadline exceeded
	ErrCodeLimitExceeded      ProtocolErrorCode = 17 // stream or quota limit reached
	ErrCodeRunnerDisabled     ProtocolErrorCode = 18 // runner disabled or revoked
	ErrCodeDraining           ProtocolErrorCode = 19 // daemon draining: no new work
	ErrCodeInternal           ProtocolErrorCode = 20 // failure on the sender's side; no details
	ErrCodeStorageUnavailable ProtocolErrorCode = 21 // the daemon's log or CAS store is full or failing; retry with backoff

	numErrCodes = 22
)

var errCodeNames = [numErrCodes]string{"",
	"Malformed", "UnknownMessage", "UnsupportedVersion", "NotRegistered", "InvalidState",
	"RoleForbidden", "RateLimited", "Overloaded", "FrameTooLarge", "StaleLease",
	"StaleSession", "SessionFenced", "NotFound", "Forbidden", "InvalidValue",
	"Timeout", "LimitExceeded", "RunnerDisabled", "Draining", "Internal",
	"StorageUnavailable",
}

// String returns the code's name, or ErrorCode(n) for a code this build does not define.
func (c ProtocolErrorCode) String() string { return enum.Name(errCodeNames[:], c, "ErrorCode") }

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (c ProtocolErrorCode) LogValue() slog.Value { return slog.StringValue(c.String()) }

// Known reports whether c is a code this build defines.
func (c ProtocolErrorCode) Known() bool { return c > 0 && c < numErrCodes }

// RetryClass tells the peer whether and how to retry (§265).
type RetryClass uint8

// Retry classes (Postcard enum discriminants).
const (
	RetryNever       RetryClass = 0 // permanent: do not retry this message
	RetryImmediately RetryClass = 1 // transient: retry now with the same MessageId
	RetryBackoff     RetryClass = 2 // temporarily unavailable/rate limited: retry after backoff
	RetryResync      RetryClass = 3 // stale: resynchronize state before retrying
	RetryUnsupported RetryClass = 4 // unsupported by this peer/version: do not retry here

	numRetryClasses = 5
)

var retryNames = [numRetryClasses]string{"Never", "Immediately", "Backoff", "Resync", "Unsupported"}

// String returns the retry class's name, or RetryClass(n) for an undefined value.
func (r RetryClass) String() string { return enum.Name(retryNames[:], r, "RetryClass") }

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (r RetryClass) LogValue() slog.Value { return slog.StringValue(r.String()) }

// MaxErrorMessage bounds WireErrorV1.Message in bytes.
const MaxErrorMessage = 512

// MsgError is the MessageTypeId of WireErrorV1.
const MsgError = MessageTypeId(uint16(FamilyCommon)<<8 | 1)

// WireErrorV1 is a protocol error reply (§263):
//
//	struct WireErrorV1 { code: u16, retry: RetryClass, message: String /* ≤ 512 */ }
//
// The message is safe text for operators: never a stack trace, payload or
// secret (§264). The envelope's correlation id names the request it answers.
type WireErrorV1 struct {
	Code    ProtocolErrorCode
	Retry   RetryClass
	Message string
}

// MessageType implements Message.
func (*WireErrorV1) MessageType() MessageTypeId { return MsgError }

// AppendPostcard implements Message.
func (m *WireErrorV1) AppendPostcard(b []byte) []byte {
	b = postcard.AppendU16(b, uint16(m.Code))
	b = postcard.AppendVariant(b, uint32(m.Retry))
	return postcard.AppendString(b, TruncateUTF8(m.Message, MaxErrorMessage))
}

// DecodePostcard implements Message. Unknown codes decode (a newer peer may
// send them) and are reported by Validate.
func (m *WireErrorV1) DecodePostcard(d *postcard.Decoder) {
	m.Code = ProtocolErrorCode(d.U16())
	m.Retry = RetryClass(d.Variant(numRetryClasses))
	m.Message = d.String(MaxErrorMessage)
}

// Validate implements Message. A zero code is invalid; unknown codes from a
// newer peer are accepted and treated by their retry class.
func (m *WireErrorV1) Validate() error {
	if m.Code == 0 {
		return errors.New("wire: WireErrorV1 with code 0")
	}
	return nil
}

// Error makes a peer's WireErrorV1 usable as a Go error: its code, retry class and message.
func (m *WireErrorV1) Error() string {
	return "peer error " + m.Code.String() + " (retry " + m.Retry.String() + "): " + m.Message
}

// CommonMessages registers the family-independent messages.
var CommonMessages = []MessageInfo{
	{Type: MsgError, Name: "common.WireErrorV1", Since: V(1, 0), MaxSize: 3 + 1 + 2 + MaxErrorMessage,
		New: func() Message { return new(WireErrorV1) }},
}
