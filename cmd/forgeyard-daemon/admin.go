package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"forgeyard.dev/transport/internal/config/setup"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
)

// daemonTelemetry holds the telemetry.Metrics the daemon engine feeds
// (daemon.Config.Metrics: messages, bytes, streams, queues, latencies,
// fencing, registration failures), adds the connection gauges from the
// daemon's hooks and the daemon.Stats counters at every scrape, and serves
// the admin endpoint.
type daemonTelemetry struct {
	m *telemetry.Metrics

	mu         sync.Mutex
	d          *daemon.Daemon
	registered map[wire.TransportSessionId]string // transport → backend, for ConnClosed

	listeners []listenerState
	cert      *x509.Certificate
}

type listenerState struct {
	backend, addr string
	active        *atomic.Bool
	err           *atomic.Pointer[string]
}

func newDaemonTelemetry() *daemonTelemetry {
	t := &daemonTelemetry{m: telemetry.NewMetrics(), registered: map[wire.TransportSessionId]string{}}
	return t
}

// hooks wraps h (the command's logging hooks) with the metric updates.
func (t *daemonTelemetry) hooks(h daemon.Hooks) daemon.Hooks {
	out := h
	out.OnRegistered = func(s daemon.SessionInfo) {
		t.mu.Lock()
		_, again := t.registered[s.Transport]
		t.registered[s.Transport] = s.Backend
		t.mu.Unlock()
		if !again {
			t.m.ConnOpened(s.Backend)
			if !s.ConnectedAt.IsZero() {
				t.m.ObserveHandshake(s.Backend, time.Since(s.ConnectedAt))
			}
			if s.Epoch > 1 {
				t.m.Reconnected(s.Backend)
			}
		}
		if h.OnRegistered != nil {
			h.OnRegistered(s)
		}
	}
	out.OnDisconnect = func(s daemon.SessionInfo, err error) {
		t.mu.Lock()
		b, ok := t.registered[s.Transport]
		delete(t.registered, s.Transport)
		t.mu.Unlock()
		if ok { // transports that never registered were never counted
			t.m.ConnClosed(b)
		}
		if h.OnDisconnect != nil {
			h.OnDisconnect(s, err)
		}
	}
	return out
}

// attach gives the telemetry its daemon, listeners and server certificate
// (before the admin endpoint serves).
func (t *daemonTelemetry) attach(d *daemon.Daemon, ls []setup.Listener, tc *tls.Config) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.d = d
	for _, l := range ls {
		st := listenerState{backend: l.Backend, addr: l.Addr().String(), active: new(atomic.Bool), err: new(atomic.Pointer[string])}
		st.active.Store(true)
		t.listeners = append(t.listeners, st)
	}
	if tc != nil && len(tc.Certificates) > 0 {
		c := tc.Certificates[0]
		if c.Leaf != nil {
			t.cert = c.Leaf
		} else if len(c.Certificate) > 0 {
			t.cert, _ = x509.ParseCertificate(c.Certificate[0])
		}
	}
	t.m.Registry().MustRegister(&statsCollector{t: t})
}

// listenerDone marks listener i inactive with err.
func (t *daemonTelemetry) listenerDone(i int, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i < len(t.listeners) {
		t.listeners[i].active.Store(false)
		if err != nil {
			s := err.Error()
			t.listeners[i].err.Store(&s)
		}
	}
}

// syncStats returns the daemon's counters for a scrape (the latency
// histograms and the fenced counter are fed by the engine itself).
func (t *daemonTelemetry) syncStats() (daemon.Stats, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.d == nil {
		return daemon.Stats{}, false
	}
	return t.d.Stats(), true
}

// statsCollector exports daemon.Stats counters that the hooks cannot see
// (forgeyard_daemon_*), read at scrape time.
type statsCollector struct{ t *daemonTelemetry }

var (
	descCompletions  = prometheus.NewDesc("forgeyard_daemon_completions_total", "Attempt completions answered, by CompletionAckKind.", []string{"ack"}, nil)
	descLeases       = prometheus.NewDesc("forgeyard_daemon_leases_total", "Lease offers and their fate: offered, accepted, rejected, revoked (expired), resent.", []string{"event"}, nil)
	descRegistration = prometheus.NewDesc("forgeyard_daemon_registrations_total", "Registrations by result: accepted, rejected (hello or registration refused), reconnect (epoch > 1).", []string{"result"}, nil)
	descCloned       = prometheus.NewDesc("forgeyard_daemon_cloned_identity_total", "Fenced transports that kept sending (a cloned runner identity, §279).", nil, nil)
	descDaemonProto  = prometheus.NewDesc("forgeyard_daemon_protocol_violations_total", "State or role violations and bad frames seen by the daemon.", nil, nil)
)

var ackLabels = [4]string{"accepted", "duplicate_accepted", "stale_rejected", "invalid_rejected"}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCompletions, descLeases, descRegistration, descCloned, descDaemonProto} {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	st, ok := c.t.syncStats()
	if !ok {
		return
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for i, l := range ackLabels {
		counter(descCompletions, st.Completions[i], l)
	}
	counter(descLeases, st.LeasesOffered, "offered")
	counter(descLeases, st.LeasesAccepted, "accepted")
	counter(descLeases, st.LeasesRejected, "rejected")
	counter(descLeases, st.LeasesRevoked, "revoked")
	counter(descLeases, st.OfferResends, "resent")
	counter(descRegistration, st.Registrations, "accepted")
	counter(descRegistration, st.Rejections, "rejected")
	counter(descRegistration, st.Reconnects, "reconnect")
	counter(descCloned, st.ClonedIdentity)
	counter(descDaemonProto, st.ProtocolErrors)
}

// health builds the DaemonHealth report.
func (t *daemonTelemetry) health() telemetry.DaemonHealth {
	now := time.Now()
	t.mu.Lock()
	d, cert := t.d, t.cert
	h := telemetry.DaemonHealth{Listeners: make([]telemetry.ListenerHealth, 0, len(t.listeners))}
	for _, l := range t.listeners {
		lh := telemetry.ListenerHealth{Backend: l.backend, Address: l.addr, Active: l.active.Load()}
		if e := l.err.Load(); e != nil {
			lh.Error = *e
		}
		h.Listeners = append(h.Listeners, lh)
	}
	t.mu.Unlock()
	if cert != nil {
		c := telemetry.CertHealthOf(cert, now)
		h.Certificate = &c
	}
	if d != nil {
		sessions := map[wire.AgentSessionId]bool{}
		for _, s := range d.Sessions() {
			h.Connections++
			if h.ConnectionsByBackend == nil {
				h.ConnectionsByBackend = map[string]int{}
			}
			h.ConnectionsByBackend[s.Backend]++
			if s.Session != (wire.AgentSessionId{}) && !s.Fenced {
				sessions[s.Session] = true
			}
		}
		h.Sessions = len(sessions)
		h.HandshakeFailures = d.Stats().Rejections
	}
	h.Evaluate(now)
	return h
}

// sessionJSON is one /sessions entry (daemon.SessionInfo with stable
// JSON names; ids are their canonical strings).
type sessionJSON struct {
	Runner        string    `json:"runner"`
	Session       string    `json:"session"`
	Transport     string    `json:"transport"`
	Epoch         uint64    `json:"epoch"`
	Role          string    `json:"role"`
	Backend       string    `json:"backend"`
	Remote        string    `json:"remote"`
	Protocol      string    `json:"protocol"`
	AgentVersion  string    `json:"agent_version"`
	State         string    `json:"state"`
	Fenced        bool      `json:"fenced"`
	LastHeartbeat time.Time `json:"last_heartbeat,omitzero"`
	ConnectedAt   time.Time `json:"connected_at"`
}

func (t *daemonTelemetry) sessions() []sessionJSON {
	t.mu.Lock()
	d := t.d
	t.mu.Unlock()
	out := []sessionJSON{}
	if d == nil {
		return out
	}
	for _, s := range d.Sessions() {
		out = append(out, sessionJSON{Runner: s.Runner.String(), Session: s.Session.String(), Transport: s.Transport.String(),
			Epoch: s.Epoch, Role: s.Role.String(), Backend: s.Backend, Remote: s.Remote, Protocol: s.Protocol.String(),
			AgentVersion: s.AgentVersion, State: s.State, Fenced: s.Fenced, LastHeartbeat: s.LastHeartbeat.UTC(), ConnectedAt: s.ConnectedAt.UTC()})
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].ConnectedAt.Equal(out[j].ConnectedAt) {
			return out[i].ConnectedAt.Before(out[j].ConnectedAt)
		}
		return out[i].Transport < out[j].Transport
	})
	return out
}

// handler is the admin mux: /metrics, /healthz, /sessions.
func (t *daemonTelemetry) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", t.m.Handler())
	mux.Handle("/healthz", telemetry.DaemonHealthHandler(t.health))
	mux.HandleFunc("GET /sessions", func(w http.ResponseWriter, r *http.Request) {
		body, err := json.MarshalIndent(t.sessions(), "", "  ")
		if err != nil {
			http.Error(w, "sessions not serializable", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(append(body, '\n'))
	})
	return mux
}

// adminServer is the running admin HTTP endpoint.
type adminServer struct {
	ln   net.Listener
	srv  *http.Server
	done chan error
}

// startAdmin listens on addr (already checked by config.AdminAddr) and
// serves h.
func startAdmin(addr string, h http.Handler, log *slog.Logger) (*adminServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	a := &adminServer{ln: ln, done: make(chan error, 1),
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
			WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}}
	go func() {
		err := a.srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		a.done <- err
	}()
	return a, nil
}

// Addr is the bound address.
func (a *adminServer) Addr() string { return a.ln.Addr().String() }

// stop shuts the server down, waiting up to timeout for requests in flight.
func (a *adminServer) stop(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := a.srv.Shutdown(ctx); err != nil {
		_ = a.srv.Close()
	}
	<-a.done
}
