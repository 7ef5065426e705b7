package trust

import (
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Alike in shape to the other packages' sentinel-error blocks, but these are
// this package's own failures, each a stable API value: they stay apart.

// Problems with credential files. A *FileError unwraps to exactly one of
// these (and to the underlying cause, if any), so callers can branch with
// errors.Is while operators read the full message.
var (
	// ErrFileNotConfigured: a required path is empty.
	ErrFileNotConfigured = errors.New("file not configured")
	// ErrFileMissing: the path does not exist.
	ErrFileMissing = errors.New("file does not exist")
	// ErrFileUnreadable: the file exists but cannot be read (permissions,
	// a directory, an I/O error).
	ErrFileUnreadable = errors.New("file cannot be read")
	// ErrNotPEM: the file has no PEM block of the expected type, or a
	// block cannot be parsed.
	ErrNotPEM = errors.New("not a usable PEM file")
	// ErrKeyMismatch: the private key does not belong to the certificate.
	ErrKeyMismatch = errors.New("private key does not match certificate")
	// ErrCertExpired: a certificate's NotAfter is in the past.
	ErrCertExpired = errors.New("certificate has expired")
	// ErrCertNotYetValid: a certificate's NotBefore is in the future
	// (often a wrong clock on this machine or the issuer's).
	ErrCertNotYetValid = errors.New("certificate is not valid yet")
	// ErrWrongKeyUsage: the certificate is not valid for the role it is
	// configured for (its ExtKeyUsage lacks serverAuth or clientAuth, or
	// a CA file holds a non-CA certificate).
	ErrWrongKeyUsage = errors.New("certificate not valid for this use")
)

// FileError reports a problem with one configured credential file. The
// message names the configuration field, the path and the problem, e.g.
//
//	trust: KeyFile "/etc/forgeyard/agent-key.pem": private key does not match certificate: ...
type FileError struct {
	Field string // configuration field, e.g. "CertFile", "ClientCAFile"
	Path  string // the path as configured (may be empty for ErrFileNotConfigured)
	Kind  error  // one of the Err* sentinels above
	Cause error  // underlying error, or nil
}

// Error names the configuration field, the path, the kind of failure and its cause.
func (e *FileError) Error() string {
	msg := fmt.Sprintf("trust: %s %q: %v", e.Field, e.Path, e.Kind)
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

// Unwrap returns Kind and Cause, so errors.Is works for both the sentinel
// and, say, fs.ErrNotExist or fs.ErrPermission.
func (e *FileError) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Cause}
}

// Errors returned by VerifyPeer besides those of RunnerIDFromCert.
var (
	// ErrHandshakeIncomplete: the connection state is from a handshake
	// that has not completed.
	ErrHandshakeIncomplete = errors.New("trust: TLS handshake not complete")
	// ErrNoVerifiedChain: the peer presented no certificate that was
	// verified against the configured CAs (for example ClientAuth was not
	// RequireAndVerifyClientCert / VerifyClientCertIfGiven, or the peer
	// sent no certificate). Unverified certificates are never trusted.
	ErrNoVerifiedChain = errors.New("trust: peer has no verified certificate chain")
)

// Operator-facing texts for credentials the daemon refuses (§22,
// §224–225). The daemon sends them in RegistrationRejectedV1 / WireErrorV1
// and the agent and CLI print them, so every surface says the same thing.
const (
	// MsgCredentialExpired: the agent's certificate expired (at the TLS
	// handshake or while connected).
	MsgCredentialExpired = "agent certificate expired: renew it before expiry (forgeyard-agent renews at 2/3 of its lifetime) or re-enroll with a new token (forgeyard runner token create; forgeyard-agent enroll)"
	// MsgCredentialRevoked: the certificate's serial was revoked.
	MsgCredentialRevoked = "agent certificate revoked by an operator: re-enroll with a new token (forgeyard runner token create; forgeyard-agent enroll)"
	// MsgRunnerDisabled: the runner was disabled (revoked) in the authority.
	MsgRunnerDisabled = "runner disabled by an operator: ask the operator to re-enable it (forgeyard runner enable) or enroll a new runner"
)

// ExplainHandshakeError turns a TLS handshake failure of an agent into an
// actionable message. leaf is the certificate the agent presented (nil for
// enrollment) and now the agent's clock. It recognises a locally expired
// certificate, and the alerts a daemon sends for an expired, unknown or
// missing client certificate (the text crypto/tls and quic-go report);
// other errors are returned unchanged as text.
func ExplainHandshakeError(err error, leaf *x509.Certificate, now time.Time) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	low := strings.ToLower(msg)
	switch {
	case leaf != nil && now.After(leaf.NotAfter):
		return MsgCredentialExpired + " (expired at " + leaf.NotAfter.UTC().Format(time.RFC3339) + "): " + msg
	case strings.Contains(low, "expired certificate"), strings.Contains(low, "certificate has expired"):
		return MsgCredentialExpired + ": " + msg
	case strings.Contains(low, "unknown certificate authority"), strings.Contains(low, "bad certificate"):
		return "the daemon does not accept this agent's certificate (signed by another CA, or damaged): re-enroll: " + msg
	case strings.Contains(low, "certificate required"):
		return "the daemon requires a client certificate: enroll this agent first (forgeyard-agent enroll): " + msg
	}
	return msg
}
