package semantics

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"time"
)

// HandshakeFailureReason classifies a failed server-side TLS handshake. The
// values are stable strings: the daemon uses them as a metric label and an
// audit attribute.
type HandshakeFailureReason string

// Handshake failure reasons.
const (
	// HandshakeNoClientCertificate: the peer sent no client certificate.
	HandshakeNoClientCertificate HandshakeFailureReason = "no_client_certificate"
	// HandshakeUnknownAuthority: the peer's certificate does not chain to a
	// trusted CA (signed by another CA, self-signed).
	HandshakeUnknownAuthority HandshakeFailureReason = "unknown_authority"
	// HandshakeCertificateExpired: the peer's certificate expired.
	HandshakeCertificateExpired HandshakeFailureReason = "certificate_expired"
	// HandshakeCertificateNotYetValid: the peer's certificate is not valid
	// yet (clock skew, or issued for the future).
	HandshakeCertificateNotYetValid HandshakeFailureReason = "certificate_not_yet_valid"
	// HandshakeBadCertificate: any other certificate problem (wrong key
	// usage, malformed, revoked, rejected by VerifyConnection).
	HandshakeBadCertificate HandshakeFailureReason = "bad_certificate"
	// HandshakeProtocol: not a usable TLS 1.3 handshake (not TLS at all, no
	// common version or ALPN, a connection closed before its first
	// record): typically a port scanner or a health checker.
	HandshakeProtocol HandshakeFailureReason = "protocol"
	// HandshakeTimeout: the handshake did not complete in time.
	HandshakeTimeout HandshakeFailureReason = "timeout"
	// HandshakeOverloaded: the server refused the connection attempt
	// before or right after the handshake because it was at a limit (too
	// many handshakes in progress, its accept queue full, a connection
	// cap); the peer is expected to retry with backoff.
	HandshakeOverloaded HandshakeFailureReason = "overloaded"
	// HandshakeOther: anything else.
	HandshakeOther HandshakeFailureReason = "other"
)

// HandshakeFailureReasons lists every reason, in a stable order.
func HandshakeFailureReasons() []HandshakeFailureReason {
	return []HandshakeFailureReason{HandshakeNoClientCertificate, HandshakeUnknownAuthority,
		HandshakeCertificateExpired, HandshakeCertificateNotYetValid, HandshakeBadCertificate,
		HandshakeProtocol, HandshakeTimeout, HandshakeOverloaded, HandshakeOther}
}

// CertificateRelated reports whether r is about the peer's certificate
// (the reasons an operator audits; protocol, timeout and other are noise
// from scanners and health checkers as often as not).
func (r HandshakeFailureReason) CertificateRelated() bool {
	switch r {
	case HandshakeNoClientCertificate, HandshakeUnknownAuthority, HandshakeCertificateExpired,
		HandshakeCertificateNotYetValid, HandshakeBadCertificate:
		return true
	}
	return false
}

// HandshakeFailure describes one failed server-side handshake, reported by
// a backend listener's OnHandshakeFailure hook.
type HandshakeFailure struct {
	// Backend is the backend name ("quic", "webtransport", "yamux").
	Backend string
	// Remote is the peer's address (for QUIC the address of its first
	// packet, not validated).
	Remote net.Addr
	// Reason classifies Err.
	Reason HandshakeFailureReason
	// ByPeer is true when the peer aborted the handshake (it sent an alert,
	// e.g. because it does not trust this side's certificate) rather than
	// this side rejecting it; Reason then classifies the peer's alert.
	ByPeer bool
	// Certificate is the peer's leaf certificate when it sent one and the
	// failure carries it (a chain that did not verify); nil otherwise. It
	// is NOT verified: every field is attacker-controlled.
	Certificate *x509.Certificate
	// Err is the handshake error.
	Err error
}

// NewHandshakeFailure builds the HandshakeFailure of err: Reason from
// ClassifyHandshakeError, Certificate from a *tls.CertificateVerificationError
// in err's chain. byPeer is the backend's knowledge that the peer aborted.
func NewHandshakeFailure(backend string, remote net.Addr, err error, byPeer bool) HandshakeFailure {
	f := HandshakeFailure{Backend: backend, Remote: remote, Reason: ClassifyHandshakeError(err), ByPeer: byPeer, Err: err}
	if cve, ok := errors.AsType[*tls.CertificateVerificationError](err); ok && len(cve.UnverifiedCertificates) > 0 {
		f.Certificate = cve.UnverifiedCertificates[0]
	}
	return f
}

// TLS alert numbers (RFC 8446 §6) the classification uses.
const (
	alertUnexpectedMessage     = 10
	alertHandshakeFailure      = 40
	alertBadCertificate        = 42
	alertUnsupportedCert       = 43
	alertCertificateRevoked    = 44
	alertCertificateExpired    = 45
	alertCertificateUnknown    = 46
	alertUnknownCA             = 48
	alertDecodeError           = 50
	alertProtocolVersion       = 70
	alertNoApplicationProtocol = 120
	alertCertificateRequired   = 116
)

// ClassifyHandshakeError classifies a server-side handshake error (from
// crypto/tls directly, or wrapped by a QUIC stack): the certificate
// verification error first (x509.UnknownAuthorityError,
// x509.CertificateInvalidError with Reason Expired, split into expired and
// not yet valid by the certificate's validity), then the TLS alert carried
// as a tls.AlertError (42–46 bad certificate, 45 expired, 48 unknown CA,
// 116 certificate required; 10, 40, 50, 70, 120 protocol), then the
// crypto/tls messages of a missing client certificate and of a peer's
// alert, timeouts (net.Error Timeout, context.DeadlineExceeded), and a
// connection that ended before or during its first record (protocol).
// Everything else is HandshakeOther; nil is "".
func ClassifyHandshakeError(err error) HandshakeFailureReason {
	if err == nil {
		return ""
	}
	if cve, ok := errors.AsType[*tls.CertificateVerificationError](err); ok {
		return classifyVerify(cve.Err, cve.UnverifiedCertificates)
	}
	if _, ok := errors.AsType[x509.UnknownAuthorityError](err); ok {
		return HandshakeUnknownAuthority
	}
	if cie, ok := errors.AsType[x509.CertificateInvalidError](err); ok {
		return classifyVerify(cie, nil)
	}
	if a, ok := errors.AsType[tls.AlertError](err); ok {
		if r := classifyAlert(uint8(a)); r != "" {
			return r
		}
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "didn't provide a certificate"), strings.Contains(msg, "certificate required"):
		return HandshakeNoClientCertificate
	case strings.Contains(msg, "unknown certificate authority"):
		return HandshakeUnknownAuthority
	case strings.Contains(msg, "expired certificate"):
		return HandshakeCertificateExpired
	case strings.Contains(msg, "bad certificate"), strings.Contains(msg, "unsupported certificate"),
		strings.Contains(msg, "revoked certificate"), strings.Contains(msg, "unknown certificate"):
		return HandshakeBadCertificate
	}
	if _, ok := errors.AsType[tls.RecordHeaderError](err); ok {
		return HandshakeProtocol
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return HandshakeTimeout
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return HandshakeTimeout
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		strings.Contains(msg, "no application protocol") || strings.Contains(msg, "protocol version") ||
		strings.Contains(msg, "unsupported versions") {
		return HandshakeProtocol
	}
	return HandshakeOther
}

func classifyVerify(err error, certs []*x509.Certificate) HandshakeFailureReason {
	if _, ok := errors.AsType[x509.UnknownAuthorityError](err); ok {
		return HandshakeUnknownAuthority
	}
	if cie, ok := errors.AsType[x509.CertificateInvalidError](err); ok && cie.Reason == x509.Expired {
		// x509 reports both ends of the validity window as Expired.
		c := cie.Cert
		if c == nil && len(certs) > 0 {
			c = certs[0]
		}
		if c != nil && time.Now().Before(c.NotBefore) || strings.Contains(cie.Detail, "is before") {
			return HandshakeCertificateNotYetValid
		}
		return HandshakeCertificateExpired
	}
	return HandshakeBadCertificate
}

func classifyAlert(a uint8) HandshakeFailureReason {
	switch a {
	case alertCertificateRequired:
		return HandshakeNoClientCertificate
	case alertUnknownCA:
		return HandshakeUnknownAuthority
	case alertCertificateExpired:
		return HandshakeCertificateExpired
	case alertBadCertificate, alertUnsupportedCert, alertCertificateRevoked, alertCertificateUnknown:
		return HandshakeBadCertificate
	case alertUnexpectedMessage, alertHandshakeFailure, alertDecodeError, alertProtocolVersion, alertNoApplicationProtocol:
		return HandshakeProtocol
	}
	return ""
}

// HandshakeStats are a listener's handshake admission counters since it
// started, for listeners that admit handshakes through a queue (the QUIC
// backends; see HandshakeCounter).
type HandshakeStats struct {
	Started   int64 `json:"started"`   // attempts admitted (their handshake began or queued)
	Completed int64 `json:"completed"` // handshakes completed (handed to Accept)
	Refused   int64 `json:"refused"`   // attempts refused before any cryptography (cap, queue full, admission)
	// RefusalsUnsent counts refusal packets the listener could not send
	// because its refusal queue was full: the client heard nothing and
	// retransmits, and its Initial is refused again. Refused counts the
	// attempt once however many of its refusals were sent.
	RefusalsUnsent int64 `json:"refusals_unsent"`
	TimedOut       int64 `json:"timed_out"` // admitted attempts that timed out (handshake timeout, or no worker in time)
	Failed         int64 `json:"failed"`    // admitted attempts that ended otherwise (TLS alert, peer gone)
	// Signed counts the handshakes whose server signature (the costly
	// part of the server's cryptography) was made: the work paid.
	Signed   int64 `json:"signed"`
	Waiting  int64 `json:"waiting"`   // attempts waiting for a handshake worker now
	InFlight int64 `json:"in_flight"` // attempts in progress now
	// Rate is the measured handshake rate (workers given back per second
	// while attempts waited); 0 before the queue was ever used.
	Rate float64 `json:"rate_per_s"`
}

// HandshakeCounter is implemented by a BackendListener that counts its
// handshake admission.
type HandshakeCounter interface {
	HandshakeStats() HandshakeStats
}
