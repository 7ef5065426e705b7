package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"forgeyard.dev/transport/internal/adminapi"
	"forgeyard.dev/transport/internal/buildinfo"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/daemonsetup"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
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
	// matrix is the --matrix-driver handler served under /v1/matrix/ on
	// the TCP admin endpoint; nil without the flag.
	matrix http.Handler
	// pprof: admin.pprof, /debug/pprof/ served (guarded like /status).
	pprof bool

	mu         sync.Mutex
	d          *daemon.Daemon
	registered map[wire.TransportSessionId]string // transport → backend, for ConnClosed
	// registrations counts transports registered since start, by backend:
	// beside a listener's signed handshakes, the handshakes that never
	// became a registration.
	registrations map[string]int64

	listeners []listenerState
	cert      func() *x509.Certificate       // the certificate served now (reloaded)
	hsf       *serversetup.HandshakeFailures // failed TLS handshakes of the listeners

	info     adminInfo
	draining atomic.Bool
}

// adminInfo is the static part of /status and /protocols.
type adminInfo struct {
	id          string
	startedAt   time.Time
	au          authority.Authority // probed by /status
	auBackend   string              // "sqlite" or "postgres"
	protocol    wire.ProtocolRange  // configured
	minProtocol wire.ProtocolVersion
	features    wire.FeatureSet
}

type listenerState struct {
	backend, addr string
	active        *atomic.Bool
	err           *atomic.Pointer[string]
	hs            semantics.HandshakeCounter // nil: the backend queues no handshakes (yamux)
}

func newDaemonTelemetry() *daemonTelemetry {
	t := &daemonTelemetry{m: telemetry.NewMetrics(), registered: map[wire.TransportSessionId]string{}, registrations: map[string]int64{}}
	// The Go runtime's and the process's figures (go_memstats_*,
	// process_*): the scale harness reads the daemon's heap from them.
	t.m.RegisterRuntimeCollectors()
	buildinfo.MustRegister(t.m.Registry()) // forgeyard_build_info
	return t
}

// setHandshakeFailures makes health report h's count.
func (t *daemonTelemetry) setHandshakeFailures(h *serversetup.HandshakeFailures) {
	t.mu.Lock()
	t.hsf = h
	t.mu.Unlock()
}

// hooks wraps h (the command's logging hooks) with the metric updates.
func (t *daemonTelemetry) hooks(h daemon.Hooks) daemon.Hooks {
	out := h
	out.OnRegistered = func(s daemon.SessionInfo) {
		t.mu.Lock()
		_, again := t.registered[s.Transport]
		t.registered[s.Transport] = s.Backend
		if !again {
			t.registrations[s.Backend]++
		}
		t.mu.Unlock()
		if !again {
			t.m.ConnOpened(s.Backend)
			if !s.ConnectedAt.IsZero() {
				t.m.ObserveHandshake(s.Backend, time.Since(s.ConnectedAt))
			}
			if s.Epoch > 1 {
				t.m.Reconnected(s.Backend)
			}
			if s.TLSResumed {
				t.m.TLSResumed(s.Backend)
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

// attach gives the telemetry its daemon, listeners and the function that
// returns the server certificate served now (before the admin endpoint
// serves).
func (t *daemonTelemetry) attach(d *daemon.Daemon, ls []serversetup.Listener, cert func() *x509.Certificate) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.d = d
	for _, l := range ls {
		st := listenerState{backend: l.Backend, addr: l.Addr().String(), active: new(atomic.Bool), err: new(atomic.Pointer[string])}
		st.hs, _ = l.BackendListener.(semantics.HandshakeCounter)
		st.active.Store(true)
		t.listeners = append(t.listeners, st)
	}
	t.cert = cert
	t.m.WatchCertificate("server", cert)
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

// scrapeStats are the daemon's counters read at a scrape (the latency
// histograms and the fenced counter are fed by the engine itself).
type scrapeStats struct {
	daemon.Stats
	hard daemon.HardeningStats
	id   daemon.IdentityStats
}

func (t *daemonTelemetry) syncStats() (scrapeStats, bool) {
	t.mu.Lock()
	d := t.d
	t.mu.Unlock()
	if d == nil {
		return scrapeStats{}, false
	}
	return scrapeStats{Stats: d.Stats(), hard: d.HardeningStats(), id: d.IdentityStats()}, true
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
	descRateLimited  = prometheus.NewDesc("forgeyard_daemon_rate_limited_total", "Messages (and CAS streams) refused by a per-connection rate ([limits]), by class: control, heartbeat, health, cas, certificate.", []string{"class"}, nil)
	descAdmission    = prometheus.NewDesc("forgeyard_daemon_admission_refused_total", "Peers refused by admission control ([admission]): connect (handshake slots, per-IP; closed Overloaded), registration (registration rate, connection cap; answered Overloaded), early (the connection cap, before the handshake completed).", []string{"stage"}, nil)
	descPaced        = prometheus.NewDesc("forgeyard_daemon_registrations_paced_total", "Hellos over the registration rate: held (waited for their token, then admitted) or deferred (refused with a retry slot, RegistrationDeferredV1; also counted in forgeyard_daemon_admission_refused_total{stage=\"registration\"}).", []string{"action"}, nil)
	descLimitCloses  = prometheus.NewDesc("forgeyard_daemon_limit_closes_total", "Connections closed LimitExceeded for persistent rate-limit violations (limits.max_rate_strikes).", nil, nil)
	descRevSkipped   = prometheus.NewDesc("forgeyard_daemon_revocation_polls_skipped_total", "Periodic revocation checks that found the authority's revocation revision unchanged and checked only the sessions registered since (SQLite).", nil, nil)
	descIdentity     = prometheus.NewDesc("forgeyard_daemon_identity_events_total", "Runner identity lifecycle: enrolled, renewed, revoked_closed (runner disabled or certificate revoked), expired_rejected, superseded_revoked (a renewed runner's previous certificate).", []string{"event"}, nil)
	descHandshakes   = prometheus.NewDesc("forgeyard_transport_handshakes_total", "QUIC and WebTransport handshake admission, by listener backend and event: started (admitted), completed (handed to the daemon), refused (before any cryptography: CONNECTION_REFUSED), timed_out, failed, signed (the server's signature made: the handshake's CPU paid).", []string{"backend", "event"}, nil)
	descHsWaiting    = prometheus.NewDesc("forgeyard_transport_handshakes_waiting", "Admitted handshakes waiting for a handshake worker now, by listener backend.", []string{"backend"}, nil)
	descHsRate       = prometheus.NewDesc("forgeyard_transport_handshake_rate", "The measured handshake rate (per second, while handshakes waited) that bounds the admission queue, by listener backend.", []string{"backend"}, nil)
	descSecrets      = prometheus.NewDesc("forgeyard_daemon_secret_streams_total", "Secret-material streams by result: delivered (acknowledged by the agent), refused (refused or failed).", []string{"result"}, nil)
)

var ackLabels = [4]string{"accepted", "duplicate_accepted", "stale_rejected", "invalid_rejected"}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCompletions, descLeases, descRegistration, descCloned, descDaemonProto,
		descRateLimited, descAdmission, descPaced, descLimitCloses, descIdentity, descRevSkipped, descSecrets, descHandshakes, descHsWaiting, descHsRate} {
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
	rl := st.hard.RateLimited
	counter(descRateLimited, rl.Control, "control")
	counter(descRateLimited, rl.Heartbeat, "heartbeat")
	counter(descRateLimited, rl.Health, "health")
	counter(descRateLimited, rl.Cas, "cas")
	counter(descRateLimited, rl.Identity, "certificate")
	counter(descAdmission, st.hard.RefusedConns, "connect")
	counter(descAdmission, st.hard.RefusedRegistrations, "registration")
	counter(descAdmission, st.hard.RefusedEarly, "early")
	counter(descPaced, st.hard.HeldRegistrations, "held")
	counter(descPaced, st.hard.DeferredRegistrations, "deferred")
	counter(descLimitCloses, st.hard.LimitCloses)
	counter(descIdentity, st.id.Enrolled, "enrolled")
	counter(descIdentity, st.id.Renewed, "renewed")
	counter(descIdentity, st.id.RevokedClosed, "revoked_closed")
	counter(descIdentity, st.id.ExpiredRejected, "expired_rejected")
	counter(descIdentity, st.id.Superseded, "superseded_revoked")
	counter(descRevSkipped, st.id.RevocationSkipped)
	counter(descSecrets, st.hard.SecretsSent, "delivered")
	counter(descSecrets, st.hard.SecretsRefused, "refused")
	c.t.mu.Lock()
	ls := append([]listenerState(nil), c.t.listeners...)
	c.t.mu.Unlock()
	for _, l := range ls {
		if l.hs == nil {
			continue
		}
		hs := l.hs.HandshakeStats()
		for _, e := range []struct {
			event string
			v     int64
		}{{"started", hs.Started}, {"completed", hs.Completed}, {"refused", hs.Refused}, {"timed_out", hs.TimedOut}, {"failed", hs.Failed}, {"signed", hs.Signed}} {
			counter(descHandshakes, e.v, l.backend, e.event)
		}
		ch <- prometheus.MustNewConstMetric(descHsWaiting, prometheus.GaugeValue, float64(hs.Waiting), l.backend)
		ch <- prometheus.MustNewConstMetric(descHsRate, prometheus.GaugeValue, hs.Rate, l.backend)
	}
}

// health builds the DaemonHealth report.
func (t *daemonTelemetry) health() telemetry.DaemonHealth {
	now := time.Now()
	t.mu.Lock()
	d, certFn, hsf := t.d, t.cert, t.hsf
	h := telemetry.DaemonHealth{Listeners: make([]telemetry.ListenerHealth, 0, len(t.listeners))}
	for _, l := range t.listeners {
		lh := telemetry.ListenerHealth{Backend: l.backend, Address: l.addr, Active: l.active.Load()}
		if e := l.err.Load(); e != nil {
			lh.Error = *e
		}
		if l.hs != nil {
			hs := l.hs.HandshakeStats()
			lh.Handshakes = &hs
			lh.HandshakesUnregistered = max(0, hs.Signed-t.registrations[l.backend])
		}
		h.Listeners = append(h.Listeners, lh)
	}
	t.mu.Unlock()
	var cert *x509.Certificate
	if certFn != nil {
		cert = certFn()
	}
	if cert != nil {
		c := telemetry.CertHealthOf(cert, now)
		h.Certificate = &c
	}
	if d != nil {
		// From counters, not by walking every connection: /healthz costs
		// the same at 10,000 agents as at one.
		c := d.Counts()
		h.Connections, h.Sessions = c.Connections, c.Sessions
		if len(c.ByBackend) > 0 {
			h.ConnectionsByBackend = c.ByBackend
		}
		st := d.Stats()
		h.RegistrationFailures = st.Rejections
		hs := d.HardeningStats()
		h.Refusals.Connect, h.Refusals.Registration = hs.RefusedConns, hs.RefusedRegistrations
		h.Refusals.Early = hs.RefusedEarly
		h.Refusals.Deferred, h.Refusals.Held = hs.DeferredRegistrations, hs.HeldRegistrations
		for _, dep := range d.Dependencies() {
			dh := dependencyHealth(dep)
			switch dep.Name {
			case daemon.DepAuthority:
				h.Authority = &dh
			case daemon.DepObjectStore:
				h.ObjectStore = &dh
			}
		}
		for _, f := range d.DataFaults() {
			h.DataStores = append(h.DataStores, telemetry.DataStoreHealth{Store: f.Store, Cause: f.Cause, Since: f.Since, Error: f.Error})
		}
	}
	if hsf != nil {
		h.HandshakeFailures = hsf.Count()
		h.Refusals.Handshake = hsf.Overloaded()
	}
	h.Evaluate(now)
	return h
}

// dependencyHealth is a daemon dependency probe in the health report's
// form.
func dependencyHealth(d daemon.DependencyHealth) telemetry.DependencyHealth {
	return telemetry.DependencyHealth{Configured: d.Configured, Probed: d.Probed, Reachable: d.Reachable,
		LatencyMs: float64(d.Latency.Microseconds()) / 1000, CheckedAt: utcOrZero(d.CheckedAt), Since: utcOrZero(d.Since),
		LastError: d.LastError, LastErrorAt: utcOrZero(d.LastErrorAt)}
}

func utcOrZero(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC()
}

// sessions is /sessions: daemon.SessionInfo with stable JSON names, oldest
// connection first.
func (t *daemonTelemetry) sessions() []adminapi.Session {
	t.mu.Lock()
	d := t.d
	t.mu.Unlock()
	out := []adminapi.Session{}
	if d == nil {
		return out
	}
	for _, s := range d.Sessions() {
		out = append(out, adminapi.Session{Runner: s.Runner.String(), Session: s.Session.String(), Transport: s.Transport.String(),
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

// authorityProbeTimeout bounds the /status authority probe.
const authorityProbeTimeout = 2 * time.Second

// status builds /status: the health report plus the authority probe and
// the drain state. An unreachable authority makes it down, draining
// degraded.
func (t *daemonTelemetry) status(ctx context.Context) adminapi.Status {
	h := t.health()
	st := adminapi.Status{Status: h.Status, Problems: h.Problems, CheckedAt: h.CheckedAt, Daemon: t.info.id,
		Version: buildinfo.Get().Version, Host: hostname(),
		StartedAt: t.info.startedAt.UTC(), Draining: t.draining.Load(), Certificate: h.Certificate,
		Connections: h.Connections, ConnectionsByBackend: h.ConnectionsByBackend, Sessions: h.Sessions,
		HandshakeFailures: h.HandshakeFailures, RegistrationFailures: h.RegistrationFailures, Listeners: make([]adminapi.Listener, 0, len(h.Listeners))}
	if st.ConnectionsByBackend == nil {
		st.ConnectionsByBackend = map[string]int{}
	}
	for _, l := range h.Listeners {
		state := adminapi.ListenerUp
		if !l.Active {
			state = adminapi.ListenerDown
		}
		st.Listeners = append(st.Listeners, adminapi.Listener{Backend: l.Backend, Address: l.Address, State: state, Error: l.Error})
	}
	st.Authority = t.probeAuthority(ctx)
	if !st.Authority.Reachable {
		st.Status = telemetry.StatusDown
		st.Problems = append(st.Problems, "authority ("+st.Authority.Backend+") unreachable: "+st.Authority.Error)
	}
	if st.Draining {
		if st.Status == telemetry.StatusOK {
			st.Status = telemetry.StatusDegraded
		}
		st.Problems = append(st.Problems, "draining: the daemon is shutting down")
	}
	return st
}

// probeAuthority asks the authority for the status of the zero RunnerId
// (a read that touches the store and changes nothing).
func (t *daemonTelemetry) probeAuthority(ctx context.Context) adminapi.Authority {
	a := adminapi.Authority{Backend: t.info.auBackend}
	if t.info.au == nil {
		a.Error = "not configured"
		return a
	}
	ctx, cancel := context.WithTimeout(ctx, authorityProbeTimeout)
	defer cancel()
	start := time.Now()
	_, err := t.info.au.RunnerStatus(ctx, wire.RunnerId{})
	a.LatencyMs = float64(time.Since(start).Microseconds()) / 1000
	if err != nil {
		a.Error = err.Error()
		return a
	}
	a.Reachable = true
	return a
}

// protocols builds /protocols.
func (t *daemonTelemetry) protocols() adminapi.Protocols {
	p := adminapi.Protocols{
		Supported:   adminapi.Range{Min: wire.Supported.Min.String(), Max: wire.Supported.Max.String()},
		Configured:  adminapi.Range{Min: t.info.protocol.Min.String(), Max: t.info.protocol.Max.String()},
		MinProtocol: t.info.minProtocol.String(),
		Features:    []string{},
		Agents:      []adminapi.VersionCount{},
	}
	if t.info.minProtocol == (wire.ProtocolVersion{}) {
		p.MinProtocol = t.info.protocol.Min.String()
	}
	for _, f := range t.info.features.List() {
		p.Features = append(p.Features, f.String())
	}
	counts := map[string]int{}
	for _, s := range t.sessions() {
		if !s.Fenced {
			counts[s.Protocol]++
		}
	}
	for v, n := range counts {
		p.Agents = append(p.Agents, adminapi.VersionCount{Protocol: v, Agents: n})
	}
	sort.Slice(p.Agents, func(i, j int) bool { return p.Agents[i].Protocol < p.Agents[j].Protocol })
	return p
}

// adminAccess says what a listener's clients may see.
type adminAccess struct {
	// tokenHash is SHA-256 of the bearer token; zero: no token configured.
	tokenHash     [32]byte
	hasToken      bool
	publicMetrics bool
	// trusted: the unix socket (file permissions authenticate).
	trusted bool
}

// allow reports whether r may read path; when not, it writes the answer.
func (a adminAccess) allow(w http.ResponseWriter, r *http.Request, path string) bool {
	if a.trusted || path == adminapi.PathHealth || path == adminapi.PathReady {
		return true
	}
	if path == adminapi.PathMetrics && (a.publicMetrics || !a.hasToken) {
		return true
	}
	if !a.hasToken {
		writeError(w, http.StatusForbidden, path+" is served only over the admin socket (admin.socket) or with a bearer token: set admin.token_file on the daemon")
		return false
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	got := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	if !ok || subtle.ConstantTimeCompare(got[:], a.tokenHash[:]) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="forgeyard-admin"`)
		writeError(w, http.StatusUnauthorized, "missing or wrong bearer token (admin.token_file)")
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	body, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		http.Error(w, "not serializable", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(append(body, '\n'))
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, adminapi.ErrorBody{Error: msg})
}

// handler is the admin mux (see internal/adminapi) behind access.
func (t *daemonTelemetry) handler(access adminAccess) http.Handler {
	mux := http.NewServeMux()
	guard := func(path string, h http.Handler) {
		mux.Handle(path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if access.allow(w, r, path) {
				h.ServeHTTP(w, r)
			}
		}))
	}
	getOnly := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				w.Header().Set("Allow", "GET, HEAD")
				writeError(w, http.StatusMethodNotAllowed, "method not allowed")
				return
			}
			h.ServeHTTP(w, r)
		})
	}
	get := func(f func(r *http.Request) any) http.Handler {
		return getOnly(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, f(r)) }))
	}
	guard(adminapi.PathMetrics, getOnly(t.m.Handler()))
	guard(adminapi.PathHealth, telemetry.DaemonHealthHandler(t.health))
	guard(adminapi.PathReady, telemetry.ReadinessHandler(func() telemetry.Readiness {
		r := telemetry.ReadinessOf(t.health())
		if t.draining.Load() { // a load balancer stops sending agents to a daemon that is shutting down
			r.Ready = false
			r.Problems = append(r.Problems, "draining: the daemon is shutting down")
		}
		return r
	}))
	guard(adminapi.PathSessions, get(func(*http.Request) any { return t.sessions() }))
	guard(adminapi.PathStatus, get(func(r *http.Request) any { return t.status(r.Context()) }))
	guard(adminapi.PathProtocols, get(func(*http.Request) any { return t.protocols() }))
	guard(adminapi.PathRunners, t.runnersHandler())     // runners.go
	guard(adminapi.PathRunners+"/", t.runnersHandler()) // a runner, its commands
	if t.pprof {
		guard("/debug/pprof/", getOnly(pprofHandler()))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such admin path; try /healthz, /readyz, /metrics, /status, /sessions, /protocols or /runners")
	})
	return mux
}

// authorityBackend names the configured authority store.
func authorityBackend(a config.AuthorityConfig) string {
	if a.PostgresDSNFile != "" {
		return "postgres"
	}
	return "sqlite"
}

// adminHandlers are the handlers daemonsetup.StartAdmin serves: over TCP
// (the --matrix-driver API beside them, testing, loopback only) for
// clients with the bearer token of cfg ("" for none), on the socket for
// all.
func (t *daemonTelemetry) adminHandlers(cfg config.Admin) daemonsetup.AdminHandlers {
	return daemonsetup.AdminHandlers{
		TCP: func(token string) http.Handler {
			access := adminAccess{publicMetrics: cfg.PublicMetrics}
			if token != "" {
				access.tokenHash, access.hasToken = sha256.Sum256([]byte(token)), true
			}
			h := t.handler(access)
			if t.matrix != nil {
				mux := http.NewServeMux()
				mux.Handle("/v1/matrix/", t.matrix)
				mux.Handle("/", h)
				h = mux
			}
			return h
		},
		Socket: func() http.Handler { return t.handler(adminAccess{trusted: true}) },
	}
}

// hostname is the host's name for /status, "" when the system has none.
func hostname() string {
	h, _ := os.Hostname()
	return h
}

// pprofHandler serves net/http/pprof's handlers under /debug/pprof/
// without registering them on http.DefaultServeMux.
func pprofHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
