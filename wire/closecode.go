package wire

import (
	"log/slog"

	"forgeyard.dev/transport/wire/internal/enum"
	"forgeyard.dev/transport/wire/postcard"
)

// CloseCode is the reason a connection closed (§102). The numbers are stable
// and are what every backend carries: the QUIC application error code, the
// WebTransport session error code, and the code in yamux's final close frame
// (§103). A peer sees the same code whatever the backend.
type CloseCode uint32

// Close codes. Never renumber; add new codes at the end.
const (
	CloseNormal                CloseCode = 0
	CloseShutdown              CloseCode = 1  // daemon or agent shutting down; reconnect elsewhere
	CloseProtocolError         CloseCode = 2  // malformed or out-of-state traffic
	CloseAuthenticationFailure CloseCode = 3  // credentials invalid, expired or revoked
	CloseVersionMismatch       CloseCode = 4  // no common protocol version
	CloseSessionFenced         CloseCode = 5  // a newer transport took over this agent session
	CloseRunnerDisabled        CloseCode = 6  // the runner was disabled by an operator
	CloseInternalError         CloseCode = 7  // a bug or failure on the closing side
	CloseRegistrationTimeout   CloseCode = 8  // authenticated but did not register in time (§60)
	CloseLimitExceeded         CloseCode = 9  // persistent stream/frame/rate limit violations (§275)
	CloseOverloaded            CloseCode = 10 // admission control refused the connection (§220)
	CloseIdleTimeout           CloseCode = 11 // no traffic within the idle timeout

	numCloseCodes = 12
)

var closeNames = [numCloseCodes]string{
	"Normal", "Shutdown", "ProtocolError", "AuthenticationFailure", "VersionMismatch",
	"SessionFenced", "RunnerDisabled", "InternalError", "RegistrationTimeout",
	"LimitExceeded", "Overloaded", "IdleTimeout",
}

// String returns the code's name from the close-code table, or CloseCode(n) for a code this build does not define.
func (c CloseCode) String() string { return enum.Name(closeNames[:], c, "CloseCode") }

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (c CloseCode) LogValue() slog.Value { return slog.StringValue(c.String()) }

// Known reports whether c is a code this build defines.
func (c CloseCode) Known() bool { return c < numCloseCodes }

// MaxCloseReason bounds the human-readable close reason in bytes.
const MaxCloseReason = 256

// CloseFrame is the last frame a backend without application close codes
// (yamux) writes before closing the session:
//
//	struct CloseFrameV1 { code: u32, reason: String /* ≤ 256 bytes */ }
type CloseFrame struct {
	Code   CloseCode
	Reason string
}

// AppendPostcard appends f, truncating the reason to MaxCloseReason bytes at
// a UTF-8 boundary.
func (f *CloseFrame) AppendPostcard(b []byte) []byte {
	b = postcard.AppendU32(b, uint32(f.Code))
	return postcard.AppendString(b, TruncateUTF8(f.Reason, MaxCloseReason))
}

// DecodePostcard reads f.
func (f *CloseFrame) DecodePostcard(d *postcard.Decoder) {
	f.Code = CloseCode(d.U32())
	f.Reason = d.String(MaxCloseReason)
}

// TruncateUTF8 returns s cut to at most n bytes without splitting a rune.
func TruncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xc0 == 0x80 {
		n--
	}
	return s[:n]
}
