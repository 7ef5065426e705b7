package trust

import (
	"errors"
	"fmt"
)

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
