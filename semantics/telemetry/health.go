package telemetry

import (
	"crypto/x509"
	"encoding/json"
	"fmt"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/telemetry/tablecell"
	"io"
	"net/http"
	"text/tabwriter"
	"time"
)

// HealthStatus summarizes a health report.
type HealthStatus string

// Health statuses. Handlers answer 200 for ok and degraded, 503 for down.
const (
	StatusOK       HealthStatus = "ok"       // everything in order
	StatusDegraded HealthStatus = "degraded" // working, but needs attention (certificate expiring, stale heartbeat, a listener down)
	StatusDown     HealthStatus = "down"     // not serving (no listener, certificate invalid, agent disconnected)
)

// CertExpiryWarning is how close to expiry a certificate makes a report
// degraded.
const CertExpiryWarning = 14 * 24 * time.Hour

// ListenerHealth is one daemon listener.
type ListenerHealth struct {
	Backend string `json:"backend"`
	Address string `json:"address"`
	Active  bool   `json:"active"`
	Error   string `json:"error,omitempty"` // why it is not active
	// Handshakes is the listener's handshake admission (QUIC and
	// WebTransport; nil for yamux, whose handshakes are not queued).
	Handshakes *semantics.HandshakeStats `json:"handshakes,omitempty"`
	// HandshakesUnregistered is Handshakes.Signed minus the transports
	// of this backend that registered: handshakes whose CPU was paid for
	// nothing (refused or timed out after the handshake, or the agent gave
	// up). Compare it with Signed.
	HandshakesUnregistered int64 `json:"handshakes_unregistered,omitempty"`
}

// CertHealth describes a certificate's validity (§213 "cert valid"). Only
// public fields of the certificate are recorded.
type CertHealth struct {
	Subject   string    `json:"subject"`
	Issuer    string    `json:"issuer"`
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
	// Valid: now is within [NotBefore, NotAfter].
	Valid bool `json:"valid"`
	// DaysToExpiry is the whole days from now to NotAfter, rounded down;
	// negative once expired.
	DaysToExpiry int `json:"days_to_expiry"`
}

// CertHealthOf describes cert at time now. A nil cert gives the zero
// CertHealth (not valid).
func CertHealthOf(cert *x509.Certificate, now time.Time) CertHealth {
	if cert == nil {
		return CertHealth{}
	}
	left := cert.NotAfter.Sub(now)
	days := int(left / (24 * time.Hour))
	if left < 0 && left%(24*time.Hour) != 0 {
		days-- // floor, not truncation toward zero
	}
	return CertHealth{
		Subject:      cert.Subject.String(),
		Issuer:       cert.Issuer.String(),
		NotBefore:    cert.NotBefore.UTC(),
		NotAfter:     cert.NotAfter.UTC(),
		Valid:        !now.Before(cert.NotBefore) && !now.After(cert.NotAfter),
		DaysToExpiry: days,
	}
}

// DaemonHealth is the daemon's transport health (§213). The caller fills
// the facts; Evaluate derives Status and Problems.
type DaemonHealth struct {
	Status      HealthStatus     `json:"status"`
	Problems    []string         `json:"problems,omitempty"`
	CheckedAt   time.Time        `json:"checked_at"`
	Listeners   []ListenerHealth `json:"listeners"`
	Certificate *CertHealth      `json:"certificate,omitempty"`
	// Connections counts open transports; ConnectionsByBackend splits them.
	Connections          int            `json:"connections"`
	ConnectionsByBackend map[string]int `json:"connections_by_backend,omitempty"`
	// Sessions counts registered agent sessions.
	Sessions int `json:"sessions"`
	// HandshakeFailures counts incoming connections whose TLS handshake
	// failed over a certificate since start, on every listener: client
	// certificates rejected (unknown CA, expired, not yet valid, bad) or
	// missing, and agents that rejected the daemon's certificate; each is an
	// auth.failure audit record. Handshakes that failed otherwise (not TLS,
	// timeout: port scanners, health checkers, abandoned dials) are only in
	// forgeyard_transport_handshake_failures_total. Registration
	// rejections are not counted here (RegistrationFailures).
	HandshakeFailures int64 `json:"handshake_failures"`
	// RegistrationFailures counts hellos and registrations refused after a
	// successful handshake (version, identity, revoked, overloaded, ...).
	RegistrationFailures int64 `json:"registration_failures"`
	// Refusals counts connection attempts refused at a limit since start,
	// by stage.
	Refusals Refusals `json:"refusals"`
	// DataStores lists the data stores failing now (daemon.DataFaults):
	// each makes the daemon degraded.
	DataStores []DataStoreHealth `json:"data_stores_failing,omitempty"`
	// Authority and ObjectStore are the daemon's last background probes
	// of its database and its content store (daemon.Dependencies): cached
	// state, never a query made for this report. They do not change
	// Status; the readiness report (ReadinessOf, /readyz) acts on them.
	Authority   *DependencyHealth `json:"authority,omitempty"`
	ObjectStore *DependencyHealth `json:"object_store,omitempty"`
}

// DependencyHealth is the last probe of a dependency of the daemon (its
// authority, its object store).
type DependencyHealth struct {
	// Configured: the daemon has this dependency; without it the other
	// fields are zero.
	Configured bool `json:"configured"`
	// Probed: a probe has finished (until then Reachable is unknown and
	// false).
	Probed    bool `json:"probed"`
	Reachable bool `json:"reachable"`
	// LatencyMs is how long the last probe took, in milliseconds.
	LatencyMs float64 `json:"latency_ms"`
	// CheckedAt is when the last probe finished.
	CheckedAt time.Time `json:"checked_at,omitzero"`
	// Since is when Reachable last changed.
	Since time.Time `json:"since,omitzero"`
	// LastError is the last failed probe's error and LastErrorAt its time;
	// they stay after a recovery.
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
}

// Readiness is the daemon's readiness report (/readyz): whether a load
// balancer should send it agents. Ready is false, and the handler answers
// 503, when the last authority probe failed: registrations would only be
// answered "retry later".
type Readiness struct {
	Ready       bool              `json:"ready"`
	Problems    []string          `json:"problems,omitempty"`
	CheckedAt   time.Time         `json:"checked_at"`
	Authority   *DependencyHealth `json:"authority,omitempty"`
	ObjectStore *DependencyHealth `json:"object_store,omitempty"`
}

// ReadinessOf derives the readiness report from a health report's
// dependency probes: not ready when the authority is configured, was
// probed and did not answer. An object store that does not answer is
// listed as a problem but keeps the daemon ready (agents can still
// register, run and complete; their uploads are answered retryable).
func ReadinessOf(h DaemonHealth) Readiness {
	r := Readiness{Ready: true, CheckedAt: h.CheckedAt, Authority: h.Authority, ObjectStore: h.ObjectStore}
	if a := h.Authority; a != nil && a.Configured && a.Probed && !a.Reachable {
		r.Ready = false
		r.Problems = append(r.Problems, "authority unreachable: "+a.LastError)
	}
	if o := h.ObjectStore; o != nil && o.Configured && o.Probed && !o.Reachable {
		r.Problems = append(r.Problems, "object store unreachable: "+o.LastError)
	}
	return r
}

// ReadinessHandler serves report() as JSON (GET or HEAD): 200 when Ready,
// 503 when not. report is called once per request and must be cheap.
func ReadinessHandler(report func() Readiness) http.Handler {
	return healthHandler(func() (any, HealthStatus) {
		r := report()
		if r.Ready {
			return &r, StatusOK
		}
		return &r, StatusDown
	})
}

// Refusals are the daemon's refusals at its limits, by stage: Handshake
// before or right after a QUIC handshake (handshakes in progress, the
// accept queue, the connection cap: reason overloaded of
// forgeyard_transport_handshake_failures_total), Early the connection cap
// among those, Connect at connect (handshake slots, per-IP, connection
// cap), Registration hellos answered Overloaded (registration rate,
// connection cap). Of those, Deferred went to agents that take a retry
// slot (RegistrationDeferredV1); Held counts hellos over the registration
// rate that were held for their token and then admitted, not refused.
type Refusals struct {
	Handshake    int64 `json:"handshake"`
	Early        int64 `json:"early"`
	Connect      int64 `json:"connect"`
	Registration int64 `json:"registration"`
	Deferred     int64 `json:"registration_deferred"`
	Held         int64 `json:"registration_held"`
}

// DataStoreHealth is a failing log or CAS store.
type DataStoreHealth struct {
	Store string    `json:"store"` // logs, cas
	Cause string    `json:"cause"` // no_space, io_error
	Since time.Time `json:"since"`
	Error string    `json:"error"`
}

// Evaluate sets Status and Problems from the facts: down without an active
// listener or with an invalid (or missing) certificate; degraded when a
// listener is inactive, the certificate expires within CertExpiryWarning
// or a data store fails.
func (h *DaemonHealth) Evaluate(now time.Time) {
	h.CheckedAt = now.UTC()
	h.Problems = nil
	down, degraded := false, false
	active := 0
	for _, l := range h.Listeners {
		if l.Active {
			active++
			continue
		}
		degraded = true
		h.Problems = append(h.Problems, fmt.Sprintf("listener %s %s inactive", l.Backend, l.Address))
	}
	if active == 0 {
		down = true
		h.Problems = append(h.Problems, "no active listener")
	}
	switch c := h.Certificate; {
	case c == nil:
		down = true
		h.Problems = append(h.Problems, "no certificate")
	case !c.Valid:
		down = true
		h.Problems = append(h.Problems, "certificate not valid now")
	case c.NotAfter.Sub(now) < CertExpiryWarning:
		degraded = true
		h.Problems = append(h.Problems, fmt.Sprintf("certificate expires in %d days", c.DaysToExpiry))
	}
	for _, ds := range h.DataStores {
		degraded = true
		h.Problems = append(h.Problems, fmt.Sprintf("%s store failing since %s: %s (%s)", ds.Store,
			ds.Since.UTC().Format(time.RFC3339), ds.Cause, ds.Error))
	}
	h.Status = rollup(down, degraded)
}

// AgentHealth is an agent's transport health (§213).
type AgentHealth struct {
	Status           HealthStatus `json:"status"`
	Problems         []string     `json:"problems,omitempty"`
	CheckedAt        time.Time    `json:"checked_at"`
	Connected        bool         `json:"connected"`
	Endpoint         string       `json:"endpoint,omitempty"`
	Backend          string       `json:"backend,omitempty"`
	Protocol         string       `json:"protocol,omitempty"` // negotiated version, "1.0"
	LastHeartbeatAck time.Time    `json:"last_heartbeat_ack,omitzero"`
	// HeartbeatAckAge is seconds since LastHeartbeatAck at CheckedAt
	// (omitted when there was none).
	HeartbeatAckAge float64 `json:"heartbeat_ack_age_seconds,omitempty"`
	Running         int     `json:"running_attempts"`
	Draining        bool    `json:"draining,omitempty"`
}

// Evaluate sets Status, Problems and HeartbeatAckAge: down when not
// connected; degraded when connected but the last heartbeat ack is older
// than staleAfter (staleAfter ≤ 0 skips that check).
func (h *AgentHealth) Evaluate(now time.Time, staleAfter time.Duration) {
	h.CheckedAt = now.UTC()
	h.Problems = nil
	h.HeartbeatAckAge = 0
	if !h.LastHeartbeatAck.IsZero() {
		h.HeartbeatAckAge = now.Sub(h.LastHeartbeatAck).Seconds()
	}
	down, degraded := false, false
	if !h.Connected {
		down = true
		h.Problems = append(h.Problems, "not connected")
	} else if staleAfter > 0 && (h.LastHeartbeatAck.IsZero() || now.Sub(h.LastHeartbeatAck) > staleAfter) {
		degraded = true
		h.Problems = append(h.Problems, "no heartbeat ack within "+staleAfter.String())
	}
	h.Status = rollup(down, degraded)
}

func rollup(down, degraded bool) HealthStatus {
	switch {
	case down:
		return StatusDown
	case degraded:
		return StatusDegraded
	}
	return StatusOK
}

// DaemonHealthHandler serves report() as JSON (GET or HEAD): 200 when ok
// or degraded, 503 when down. report is called once per request and must
// be safe for concurrent use; it should call Evaluate.
func DaemonHealthHandler(report func() DaemonHealth) http.Handler {
	return healthHandler(func() (any, HealthStatus) { h := report(); return &h, h.Status })
}

// AgentHealthHandler serves report() like DaemonHealthHandler.
func AgentHealthHandler(report func() AgentHealth) http.Handler {
	return healthHandler(func() (any, HealthStatus) { h := report(); return &h, h.Status })
}

func healthHandler(report func() (any, HealthStatus)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		v, st := report()
		body, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			http.Error(w, "health report not serializable", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		code := http.StatusOK
		if st == StatusDown || st == "" {
			code = http.StatusServiceUnavailable
		}
		w.WriteHeader(code)
		if r.Method == http.MethodGet {
			_, _ = w.Write(append(body, '\n'))
		}
	})
}

// WriteTable renders h for humans (forgeyard transport status).
func (h *DaemonHealth) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "STATUS\t%s\n", h.Status)
	for _, p := range h.Problems {
		fmt.Fprintf(tw, "PROBLEM\t%s\n", p)
	}
	fmt.Fprintf(tw, "CONNECTIONS\t%d%s\n", h.Connections, tablecell.ByBackend(h.ConnectionsByBackend))
	fmt.Fprintf(tw, "SESSIONS\t%d\n", h.Sessions)
	fmt.Fprintf(tw, "HANDSHAKE FAILURES\t%d\n", h.HandshakeFailures)
	fmt.Fprintf(tw, "REGISTER FAILURES\t%d\n", h.RegistrationFailures)
	if c := h.Certificate; c != nil {
		fmt.Fprintf(tw, "CERTIFICATE\t%s\n", c.Subject)
		fmt.Fprintf(tw, "  valid\t%s (%s → %s)\n", tablecell.YesNo(c.Valid), day(c.NotBefore), day(c.NotAfter))
		fmt.Fprintf(tw, "  days to expiry\t%d\n", c.DaysToExpiry)
	} else {
		fmt.Fprintf(tw, "CERTIFICATE\tnone\n")
	}
	fmt.Fprintf(tw, "\nLISTENER\tBACKEND\tACTIVE\tERROR\n")
	for _, l := range h.Listeners {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", l.Address, l.Backend, tablecell.YesNo(l.Active), tablecell.Dash(l.Error))
	}
	return tw.Flush()
}

// WriteTable renders h for humans (forgeyard-agent status).
func (h *AgentHealth) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "STATUS\t%s\n", h.Status)
	for _, p := range h.Problems {
		fmt.Fprintf(tw, "PROBLEM\t%s\n", p)
	}
	fmt.Fprintf(tw, "CONNECTED\t%s\n", tablecell.YesNo(h.Connected))
	fmt.Fprintf(tw, "ENDPOINT\t%s\n", tablecell.Dash(h.Endpoint))
	fmt.Fprintf(tw, "BACKEND\t%s\n", tablecell.Dash(h.Backend))
	fmt.Fprintf(tw, "PROTOCOL\t%s\n", tablecell.Dash(h.Protocol))
	if h.LastHeartbeatAck.IsZero() {
		fmt.Fprintf(tw, "LAST HEARTBEAT ACK\tnever\n")
	} else {
		fmt.Fprintf(tw, "LAST HEARTBEAT ACK\t%s (%.1fs ago)\n", h.LastHeartbeatAck.UTC().Format(time.RFC3339), h.HeartbeatAckAge)
	}
	fmt.Fprintf(tw, "RUNNING ATTEMPTS\t%d\n", h.Running)
	if h.Draining {
		fmt.Fprintf(tw, "DRAINING\tyes\n")
	}
	return tw.Flush()
}

func day(t time.Time) string { return t.UTC().Format("2006-01-02") }
