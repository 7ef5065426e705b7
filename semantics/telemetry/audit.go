package telemetry

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net"
	"net/netip"
	"strconv"

	"forgeyard.dev/transport/wire"
)

// AuditEvent is a security audit event (§279). Its String is the stable
// event name written as the "event" attribute.
type AuditEvent uint8

// Audit events. Names are stable: alerting rules select on them.
const (
	EventAuthFailure       AuditEvent = iota + 1 // "auth.failure": certificate, key proof or identity check failed
	EventSessionFenced                           // "session.fenced": a transport lost control authority to a newer registration
	EventClonedIdentity                          // "transport.cloned_identity": a fenced transport kept talking
	EventDowngradeRejected                       // "protocol.downgrade_rejected": version or feature below policy refused
	EventStaleLeaseReplay                        // "lease.stale_replay": a stale or superseded lease was replayed
	EventMalformedSecurity                       // "message.malformed_security": a security-sensitive message failed to decode or validate
	EventRunnerRevoked                           // "runner.revoked": a revoked or disabled runner was refused
	EventAdminCommand                            // "runner.admin_command": an operator's admin command on a runner (drain, resume, refresh capabilities, probe)
	EventDataStoreFailed                         // "data.store_failed": the log or CAS store started failing writes (disk full, I/O error)
	numAuditEvents
)

var auditEventNames = [numAuditEvents]string{"",
	"auth.failure", "session.fenced", "transport.cloned_identity", "protocol.downgrade_rejected",
	"lease.stale_replay", "message.malformed_security", "runner.revoked", "runner.admin_command", "data.store_failed"}

// String returns the stable event name, or "unknown".
func (e AuditEvent) String() string {
	if e > 0 && e < numAuditEvents {
		return auditEventNames[e]
	}
	return LabelUnknown
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (e AuditEvent) LogValue() slog.Value { return slog.StringValue(e.String()) }

// AuditEvents lists every event.
func AuditEvents() []AuditEvent {
	out := make([]AuditEvent, 0, numAuditEvents-1)
	for e := AuditEvent(1); e < numAuditEvents; e++ {
		out = append(out, e)
	}
	return out
}

// AuditReason is the reason attribute: a closed set, so no free-form text
// (which could carry a token or a payload) reaches the audit log.
type AuditReason uint8

// Audit reasons.
const (
	ReasonUnspecified            AuditReason = iota
	ReasonBadCertificate                     // chain did not verify, expired, wrong CA
	ReasonKeyProofFailed                     // registration key proof did not verify
	ReasonRunnerMismatch                     // RunnerId differs from the certificate's
	ReasonUnknownRunner                      // no such runner
	ReasonRevoked                            // runner revoked or disabled
	ReasonVersionBelowMinimum                // protocol version below policy minimum
	ReasonFeatureDowngrade                   // a required feature was not offered
	ReasonNewerRegistration                  // fenced by a newer registration of the session
	ReasonFencedTraffic                      // traffic on a fenced transport
	ReasonLeaseExpired                       // lease past its expiry
	ReasonLeaseSuperseded                    // lease revoked or re-offered elsewhere
	ReasonDecodeFailed                       // message failed to decode
	ReasonValidationFailed                   // message decoded but failed validation
	ReasonSignatureInvalid                   // signature did not verify
	ReasonNoClientCertificate                // TLS handshake: the peer sent no client certificate
	ReasonUnknownAuthority                   // TLS handshake: certificate not signed by a trusted CA
	ReasonCertificateExpired                 // TLS handshake: certificate expired
	ReasonCertificateNotYetValid             // TLS handshake: certificate not valid yet
	ReasonHandshakeProtocol                  // TLS handshake: not TLS 1.3, no common ALPN, closed early
	ReasonHandshakeTimeout                   // TLS handshake: did not complete in time
	ReasonEnrollmentRefused                  // enrollment token unknown, used, expired or revoked, or enrollment disabled
	ReasonOverloaded                         // refused at a limit (handshakes in progress, accept queue, connection cap)
	ReasonAdminDrain                         // admin command: drain
	ReasonAdminResume                        // admin command: resume
	ReasonAdminRefresh                       // admin command: refresh capabilities
	ReasonAdminProbe                         // admin command: run a health probe
	ReasonNoSpace                            // data store: no space left (ENOSPC, quota, the object store's "storage full")
	ReasonIOError                            // data store: another I/O or object store error
	numAuditReasons
)

var auditReasonNames = [numAuditReasons]string{"unspecified",
	"bad_certificate", "key_proof_failed", "runner_mismatch", "unknown_runner", "revoked",
	"version_below_minimum", "feature_downgrade", "newer_registration", "fenced_traffic",
	"lease_expired", "lease_superseded", "decode_failed", "validation_failed", "signature_invalid",
	"no_client_certificate", "unknown_authority", "certificate_expired", "certificate_not_yet_valid",
	"protocol", "timeout", "enrollment_refused", "overloaded", "drain", "resume", "refresh_capabilities", "health_probe", "no_space", "io_error"}

// String returns the stable reason name, or "unspecified".
func (r AuditReason) String() string {
	if r < numAuditReasons {
		return auditReasonNames[r]
	}
	return auditReasonNames[ReasonUnspecified]
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (r AuditReason) LogValue() slog.Value { return slog.StringValue(r.String()) }

// Audit attribute keys: the only keys an audit record carries besides
// "event" (§212: no payloads, keys or tokens).
const (
	AuditKeyEvent     = "event"
	AuditKeyRunner    = "runner"
	AuditKeySession   = "session"
	AuditKeyTransport = "transport"
	AuditKeyRemote    = "remote"
	AuditKeyCode      = "code"
	AuditKeyReason    = "reason"
	// Keys of TLS handshake failures (auth.failure from a listener).
	AuditKeyBackend    = "backend"
	AuditKeyByPeer     = "by_peer"
	AuditKeySubject    = "cert_subject"
	AuditKeyIssuer     = "cert_issuer"
	AuditKeySerial     = "cert_serial"
	AuditKeyError      = "error"
	AuditKeySuppressed = "suppressed"
)

// HandshakeFailureReasons are the reason label values of
// forgeyard_transport_handshake_failures_total and the reason attribute of
// a handshake auth.failure: semantics.HandshakeFailureReasons as strings.
var HandshakeFailureReasons = []string{"no_client_certificate", "unknown_authority", "certificate_expired",
	"certificate_not_yet_valid", "bad_certificate", "protocol", "timeout", "overloaded", "other"}

// AuditReasonOfHandshake maps a handshake failure reason (one of
// HandshakeFailureReasons) to its AuditReason; anything else is
// ReasonUnspecified.
func AuditReasonOfHandshake(reason string) AuditReason {
	switch reason {
	case "no_client_certificate":
		return ReasonNoClientCertificate
	case "unknown_authority":
		return ReasonUnknownAuthority
	case "certificate_expired":
		return ReasonCertificateExpired
	case "certificate_not_yet_valid":
		return ReasonCertificateNotYetValid
	case "bad_certificate":
		return ReasonBadCertificate
	case "protocol":
		return ReasonHandshakeProtocol
	case "timeout":
		return ReasonHandshakeTimeout
	case "overloaded":
		return ReasonOverloaded
	}
	return ReasonUnspecified
}

// Backend is the backend attribute (closed set: Backends, else "other").
func Backend(name string) AuditAttr { return AuditAttr{AuditKeyBackend, backendLabel(name)} }

// RemoteIP is the remote attribute with the IP address only (no port).
func RemoteIP(addr net.Addr) AuditAttr {
	s := remoteString(addr)
	if ap, err := netip.ParseAddrPort(s); err == nil {
		s = ap.Addr().String()
	}
	return AuditAttr{AuditKeyRemote, s}
}

// ByPeer is the by_peer attribute: "true" when the peer aborted the
// handshake (it rejected this side's certificate), "false" otherwise.
func ByPeer(b bool) AuditAttr { return AuditAttr{AuditKeyByPeer, strconv.FormatBool(b)} }

// CertSubject, CertIssuer and CertSerial describe an unverified peer
// certificate. Subject and issuer are the RFC 2253 distinguished names,
// reduced to printable ASCII and cut to maxAuditText bytes (the peer chose
// them); the serial is hexadecimal. A nil certificate gives a zero
// AuditAttr, which Emit skips.
func CertSubject(c *x509.Certificate) AuditAttr {
	if c == nil {
		return AuditAttr{}
	}
	return AuditAttr{AuditKeySubject, auditText(c.Subject.String())}
}

// CertIssuer: see CertSubject.
func CertIssuer(c *x509.Certificate) AuditAttr {
	if c == nil {
		return AuditAttr{}
	}
	return AuditAttr{AuditKeyIssuer, auditText(c.Issuer.String())}
}

// CertSerial: see CertSubject.
func CertSerial(c *x509.Certificate) AuditAttr {
	if c == nil || c.SerialNumber == nil {
		return AuditAttr{}
	}
	return AuditAttr{AuditKeySerial, auditText(c.SerialNumber.Text(16))}
}

// SerialHex is the serial attribute for a certificate known only by its
// recorded serial (trust.SerialString): hexadecimal digits only, anything
// else dropped, cut to maxAuditText.
func SerialHex(serial string) AuditAttr {
	b := make([]byte, 0, min(len(serial), maxAuditText))
	for i := 0; i < len(serial) && len(b) < maxAuditText; i++ {
		if c := serial[i]; c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' {
			b = append(b, c)
		}
	}
	return AuditAttr{AuditKeySerial, string(b)}
}

// ErrorText is the error attribute: a short diagnostic (a TLS or x509
// error message, never a payload), reduced to printable ASCII and cut to
// maxAuditText bytes. A nil error gives a zero AuditAttr.
func ErrorText(err error) AuditAttr {
	if err == nil {
		return AuditAttr{}
	}
	return AuditAttr{AuditKeyError, auditText(err.Error())}
}

// Suppressed is the suppressed attribute: how many records of the same
// kind a rate limit dropped before this one (see AuditLimiter).
func Suppressed(n int64) AuditAttr { return AuditAttr{AuditKeySuppressed, strconv.FormatInt(n, 10)} }

// maxAuditText bounds a text attribute.
const maxAuditText = 200

// auditText keeps printable ASCII (others become '?') and cuts s to
// maxAuditText bytes.
func auditText(s string) string {
	b := make([]byte, 0, min(len(s), maxAuditText))
	for _, r := range s {
		if len(b) >= maxAuditText {
			break
		}
		if r < 0x20 || r > 0x7e {
			r = '?'
		}
		b = append(b, byte(r))
	}
	return string(b)
}

// AuditAttr is one audit attribute. It has no exported fields: the only
// way to make one is the constructors below, each of which renders a typed
// value (an id, an address, an enum), so an audit record cannot carry
// free-form text.
type AuditAttr struct {
	key, val string
}

// Runner is the runner attribute.
func Runner(id wire.RunnerId) AuditAttr { return AuditAttr{AuditKeyRunner, id.String()} }

// Session is the agent session attribute.
func Session(id wire.AgentSessionId) AuditAttr { return AuditAttr{AuditKeySession, id.String()} }

// Transport is the transport session attribute.
func Transport(id wire.TransportSessionId) AuditAttr {
	return AuditAttr{AuditKeyTransport, id.String()}
}

// Remote is the peer address attribute (diagnostic only, §205). Only an IP
// address and port are recorded: an address that does not parse as one
// (a custom net.Addr, a pipe) is recorded as its network name only.
func Remote(addr net.Addr) AuditAttr {
	return AuditAttr{AuditKeyRemote, remoteString(addr)}
}

// RemoteAddrPort is Remote for a netip.AddrPort.
func RemoteAddrPort(ap netip.AddrPort) AuditAttr {
	if !ap.IsValid() {
		return AuditAttr{AuditKeyRemote, "invalid"}
	}
	return AuditAttr{AuditKeyRemote, unmap(ap)}
}

// Code is the protocol error code attribute (a code this build does not
// define is recorded by number).
func Code(c wire.ProtocolErrorCode) AuditAttr {
	if c.Known() {
		return AuditAttr{AuditKeyCode, c.String()}
	}
	return AuditAttr{AuditKeyCode, strconv.Itoa(int(c))}
}

// Reason is the reason attribute.
func Reason(r AuditReason) AuditAttr { return AuditAttr{AuditKeyReason, r.String()} }

func remoteString(addr net.Addr) string {
	switch a := addr.(type) {
	case nil:
		return "none"
	case *net.UDPAddr:
		if a == nil {
			return "none"
		}
		return unmap(a.AddrPort())
	case *net.TCPAddr:
		if a == nil {
			return "none"
		}
		return unmap(a.AddrPort())
	}
	// Do not trust an arbitrary String(): accept it only if it is an
	// address.
	s := addr.String()
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return unmap(ap)
	}
	if ip, err := netip.ParseAddr(s); err == nil {
		return ip.Unmap().String()
	}
	return "unparsed(" + networkName(addr.Network()) + ")"
}

func unmap(ap netip.AddrPort) string {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String()
}

func networkName(n string) string {
	switch n {
	case "udp", "udp4", "udp6", "tcp", "tcp4", "tcp6", "unix", "unixgram", "unixpacket", "pipe", "memory":
		return n
	}
	return "other"
}

// Audit writes security audit events (§279) as slog records at level Warn
// with message "audit" and the attributes event, then runner, session,
// transport, remote, code, reason as given (a repeated key keeps its last
// value). It is safe for concurrent use; a nil *Audit drops events.
type Audit struct {
	log *slog.Logger
}

// NewAudit returns an Audit writing to log (slog.Default() when nil).
func NewAudit(log *slog.Logger) *Audit {
	if log == nil {
		log = slog.Default()
	}
	return &Audit{log: log}
}

// Emit records event with attrs.
func (a *Audit) Emit(ctx context.Context, event AuditEvent, attrs ...AuditAttr) {
	if a == nil {
		return
	}
	if ctx == nil {
		ctx = context.Background()
	}
	if !a.log.Enabled(ctx, slog.LevelWarn) {
		return
	}
	var buf [8]slog.Attr
	out := append(buf[:0], slog.String(AuditKeyEvent, event.String()))
next:
	for _, at := range attrs {
		if at.key == "" {
			continue // zero AuditAttr
		}
		for i := 1; i < len(out); i++ {
			if out[i].Key == at.key {
				out[i].Value = slog.StringValue(at.val)
				continue next
			}
		}
		out = append(out, slog.String(at.key, at.val))
	}
	a.log.LogAttrs(ctx, slog.LevelWarn, "audit", out...)
}
