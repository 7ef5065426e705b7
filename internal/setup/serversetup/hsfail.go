package serversetup

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	xrate "golang.org/x/time/rate"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/telemetry"
)

// HandshakeFailures turns the listeners' failed TLS handshakes
// (quic/webtransport/yamux Config.OnHandshakeFailure) into operator
// signals: every failure counts in
// forgeyard_transport_handshake_failures_total{backend,reason}; one about
// a certificate (reason no_client_certificate, unknown_authority,
// certificate_expired, certificate_not_yet_valid, bad_certificate) also
// counts in Count (/healthz handshake_failures) and is an auth.failure
// audit record, bounded by an AuditLimiter; the rest (protocol, timeout,
// other: port scanners, health checkers, agents abandoning the losing
// dial of a backend race) are logged at Debug only. Safe for concurrent
// use.
type HandshakeFailures struct {
	m     *telemetry.Metrics
	audit *telemetry.AuditLimiter
	log   *slog.Logger
	count atomic.Int64

	overloaded atomic.Int64
	warnEvery  xrate.Sometimes // the refusal warning, at most once per interval
	warned     atomic.Int64    // overloaded at the last warning
}

// NewHandshakeFailures reports to log (its audit records and debug lines;
// slog.Default() when nil) and m (nil: no metric), with at most rate
// audit records per second and burst at once (≤ 0: telemetry's
// DefaultAuditRate 10/s, DefaultAuditBurst 20). Close it at shutdown to
// write a pending suppressed count.
func NewHandshakeFailures(log *slog.Logger, m *telemetry.Metrics, rate float64, burst int) *HandshakeFailures {
	if log == nil {
		log = slog.Default()
	}
	return &HandshakeFailures{m: m, log: log, audit: telemetry.NewAuditLimiter(telemetry.NewAudit(log), log, rate, burst),
		warnEvery: xrate.Sometimes{Interval: overloadWarnEvery}}
}

// Report is the OnHandshakeFailure hook. It never blocks on anything but
// the logger, and writes at most the audit limit.
func (h *HandshakeFailures) Report(f semantics.HandshakeFailure) {
	h.m.HandshakeFailed(f.Backend, string(f.Reason))
	if f.Reason == semantics.HandshakeOverloaded {
		n := h.overloaded.Add(1)
		h.warnEvery.Do(func() {
			since := n - h.warned.Swap(n)
			h.log.Warn("refusing connections at a limit; agents retry with backoff", "backend", f.Backend,
				"cause", f.Err, "refused_since_last_warning", since, "refused_total", n)
		})
		return
	}
	if !f.Reason.CertificateRelated() {
		if h.log.Enabled(context.Background(), slog.LevelDebug) {
			h.log.Debug("tls handshake failed", "backend", f.Backend, "remote", f.Remote,
				"reason", string(f.Reason), "by_peer", f.ByPeer, "err", f.Err)
		}
		return
	}
	h.count.Add(1)
	h.audit.Emit(context.Background(), telemetry.EventAuthFailure,
		telemetry.Backend(f.Backend), telemetry.RemoteIP(f.Remote),
		telemetry.Reason(telemetry.AuditReasonOfHandshake(string(f.Reason))), telemetry.ByPeer(f.ByPeer),
		telemetry.CertSubject(f.Certificate), telemetry.CertIssuer(f.Certificate), telemetry.CertSerial(f.Certificate),
		telemetry.ErrorText(f.Err))
}

// overloadWarnEvery is the least interval between two refusal warnings.
const overloadWarnEvery = 10 * time.Second

// Overloaded returns the connection attempts refused at a limit since
// start (reason overloaded: handshakes in progress, the accept queue, the
// connection cap); a refused attempt whose first packet the client
// retransmits counts again.
func (h *HandshakeFailures) Overloaded() int64 { return h.overloaded.Load() }

// Count returns the handshakes that failed over a certificate since start
// (the audited reasons; the metric has every reason).
func (h *HandshakeFailures) Count() int64 { return h.count.Load() }

// Suppressed returns the audit records the limit dropped since start.
func (h *HandshakeFailures) Suppressed() int64 { return h.audit.Suppressed() }

// Close writes the count of audit records suppressed and not yet reported.
func (h *HandshakeFailures) Close() { h.audit.Close() }
