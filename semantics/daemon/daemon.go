package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/semantics/retention"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// SentTypes is every message type the daemon can send to a peer of any
// role, derived from the session package's direction and role tables
// (session.DaemonSendable) — the same tables the send path checks every
// outgoing envelope against (send.go), so it cannot drift from what is
// sent: session and lease messages, typed admin commands, health probe
// requests, the signing and device requests, errors, and the data plane's
// acknowledgements and download headers.
var SentTypes = sentTypes()

const (
	maxViolations  = 3    // state/role violations before CloseProtocolError
	maxLatencyKeep = 1024 // latency samples kept per kind
	maxSeqSessions = 1 << 16
)

// Daemon serves agents. Create it with New; all methods are safe for
// concurrent use.
type Daemon struct {
	cfg    Config
	timing Timing
	auth   authority.Authority
	log    *slog.Logger
	now    func() time.Time
	proto  wire.ProtocolRange // effective range (MinProtocol applied)

	authFail authFailLog // rate-limited log of authority failures (authfail.go)
	dbc      dbClock     // the authority's clock of lease times (dbclock.go)

	ctx    context.Context // ends at Shutdown
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	conns     map[wire.TransportSessionId]*conn
	bySession map[wire.AgentSessionId]*conn
	byBackend map[string]int // len(conns) by Backend(), for Counts
	nConns    atomic.Int64   // len(conns), updated with it (connCount)
	// byRunner indexes the registered transports (of conns) by runner, so
	// registration, fencing and lease offers cost the same at any fleet
	// size instead of a walk over every connection.
	byRunner map[wire.RunnerId]map[*conn]struct{}
	drained  map[wire.RunnerId]string
	// drainMu orders what an agent is told of its drain state: held from
	// reading (or storing) the state to sending DrainV1/ResumeV1, so a
	// drain re-sent to a resynced agent cannot arrive after the resume
	// that ended it (drain.go, inventory.go resendDrain, runnerevent.go).
	drainMu   sync.Mutex
	offers    map[wire.LeaseId]*offer
	probing   map[wire.LeaseId]time.Time
	hbSeq     map[wint]uint64
	listeners []semantics.BackendListener
	shutdown  bool

	// offerFilter, when set (tests only, see export_test.go), is asked
	// before every offer send; false drops the offer as if it were lost.
	offerFilter atomic.Pointer[func(wire.LeaseId) bool]

	// Data plane (data.go): nil receiver/server when not configured.
	logRecv    *logs.Receiver
	ownSink    *logs.FileSink
	logSink    logs.LogSink // the configured (or own) sink, unwrapped
	dataHealth *dataHealth
	finalSeq   *recent[wire.JobAttemptId, uint64] // LastSeq of each LogsFinalizedV1 received
	casSrv     *cas.Server
	logConns   map[wire.JobAttemptId]*conn // under mu: the connection serving an attempt's log
	// outputs (under mu): the OutputsFinalizedV1 outputs of the last
	// maxRecordedOutputs attempts that declared them (FinalizedOutputs).
	outputs *recent[wire.JobAttemptId, []wire.CasObjectRef]
	// ended (under mu): the last maxEndedAttempts attempts whose log state
	// was forgotten at completion or revocation, so a logs-finalized
	// barrier answered after the end does not re-create it.
	ended *recent[wire.JobAttemptId, struct{}]

	st    stats
	audit *telemetry.Audit
	idst  identityStats // enroll.go
	inv   invState      // inventory.go: capabilities and health of this daemon's transports
	// hard: admission control, rate-limit counters (admission.go).
	hard  hardening
	pacer retryPacer // retry slots of deferred registrations (pacing.go)
	// watching: the authority delivers events (authority.Watcher), so
	// revocation checks are event-driven (revocation.go).
	watching         bool
	deps             *depProber // depprobe.go
	retPager         retention.Pager
	revocationEvents atomic.Int64 // authority.EventRunner events handled
	// revocationSkips: full revocation checks skipped because the
	// authority's revocation revision had not changed (revocation.go;
	// only the transports registered since were checked).
	revocationSkips atomic.Int64
	// lastRevision is the revision read before the last full check that
	// completed; only the revocation loop touches it (revocation.go).
	lastRevision  authority.Revision
	revisionKnown bool
	// peers: what signing workers and device agents registered with, and
	// the device reservations (peers.go, sign.go, device.go).
	peers peerTable
}

type wint = wire.AgentSessionId

// New validates cfg and returns a Daemon whose background loop (lease
// expiry with grace and probes, dedup pruning) runs until Shutdown.
func New(cfg Config) (*Daemon, error) {
	if cfg.Authority == nil {
		return nil, errors.New("daemon: Config.Authority is required")
	}
	if err := cfg.validateLimits(); err != nil {
		return nil, err
	}
	if cfg.Protocol == (wire.ProtocolRange{}) {
		cfg.Protocol = wire.Supported
	}
	if !cfg.Protocol.Valid() {
		return nil, fmt.Errorf("daemon: Config.Protocol %s is not a valid range", cfg.Protocol)
	}
	if len(cfg.Timing.FallbackStagger) > agentwire.MaxFallbackStagger {
		return nil, fmt.Errorf("daemon: Config.Timing.FallbackStagger has %d entries (max %d)", len(cfg.Timing.FallbackStagger), agentwire.MaxFallbackStagger)
	}
	if len(cfg.AlternateEndpoints) > agentwire.MaxAlternateEndpoints {
		return nil, fmt.Errorf("daemon: Config.AlternateEndpoints has %d entries (max %d)", len(cfg.AlternateEndpoints), agentwire.MaxAlternateEndpoints)
	}
	seen := map[string]bool{}
	for i, e := range cfg.AlternateEndpoints {
		if e == "" || len(e) > agentwire.MaxEndpoint || seen[e] {
			return nil, fmt.Errorf("daemon: Config.AlternateEndpoints[%d] %q is empty, longer than %d bytes or repeated", i, e, agentwire.MaxEndpoint)
		}
		seen[e] = true
	}
	if cfg.Protocol.Max.Less(cfg.MinProtocol) {
		return nil, fmt.Errorf("daemon: Config.MinProtocol %s is above Config.Protocol %s", cfg.MinProtocol, cfg.Protocol)
	}
	if cfg.ID == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		cfg.ID = "daemon-" + hex.EncodeToString(b[:])
	}
	if cfg.DedupRetention <= 0 {
		cfg.DedupRetention = DefaultDedupRetention
	}
	cfg.AlternateEndpoints = append([]string(nil), cfg.AlternateEndpoints...)
	d := &Daemon{cfg: cfg, timing: cfg.Timing.withDefaults(), auth: cfg.Authority, log: cfg.Logger, now: cfg.Now,
		conns: map[wire.TransportSessionId]*conn{}, bySession: map[wire.AgentSessionId]*conn{}, byRunner: map[wire.RunnerId]map[*conn]struct{}{},
		drained: map[wire.RunnerId]string{}, offers: map[wire.LeaseId]*offer{}, probing: map[wire.LeaseId]time.Time{},
		hbSeq: map[wint]uint64{}}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	d.log = d.log.With("daemon", cfg.ID)
	d.audit = telemetry.NewAudit(d.log)
	d.initHardening()
	if d.now == nil {
		d.now = time.Now
	}
	d.proto = cfg.Protocol
	if d.proto.Min.Less(cfg.MinProtocol) {
		d.proto.Min = cfg.MinProtocol
	}
	if err := d.setupData(); err != nil {
		return nil, err
	}
	d.initDBClock()
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.wg.Add(1)
	go d.maintenance()
	d.startProber()
	if w := authority.WatcherOf(d.auth); w != nil {
		// Cancels and revocations made by other daemons sharing the
		// authority, delivered to this daemon's agents at once (cancel.go).
		if ch, err := w.Watch(d.ctx); err == nil && ch != nil {
			d.watching = true // revocation.go: event-driven revocation checks
			d.wg.Add(1)
			go d.watchLoop(ch)
		} else if err != nil {
			d.log.Warn("authority events unavailable; cancels from other daemons reach agents at their next renewal", "err", err)
		}
	}
	if d.cfg.Retention.enabled() {
		d.wg.Add(1)
		go d.runRetention()
	}
	if p := cfg.Identity.RevocationPoll; p >= 0 {
		if p == 0 {
			p = DefaultRevocationPoll
		}
		d.wg.Add(1)
		go d.revocationLoop(d.revocationPeriod(p))
	}
	return d, nil
}

// Timing returns the effective timing policy (defaults applied).
func (d *Daemon) Timing() Timing { return d.timing }

// Serve accepts connections from l until l fails or Shutdown. Call it once
// per listener; any set of backends can be served at once. It returns nil
// after Shutdown, otherwise the listener's error.
func (d *Daemon) Serve(ctx context.Context, l semantics.BackendListener) error {
	d.mu.Lock()
	if d.shutdown {
		d.mu.Unlock()
		return ErrShutdown
	}
	d.listeners = append(d.listeners, l)
	d.mu.Unlock()
	// Connections live on the caller's ctx, not on this accept loop: when
	// Shutdown closes the listener, Serve returns but the connections stay up
	// long enough to receive their GoAway and close with CloseShutdown.
	connCtx := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-d.ctx.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		bc, err := l.Accept(ctx)
		if err != nil {
			d.mu.Lock()
			down := d.shutdown
			d.mu.Unlock()
			if down || d.ctx.Err() != nil {
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		// The connection goroutine joins d.wg under d.mu, and only before
		// Shutdown has set d.shutdown (as adoptOffers does): Shutdown
		// closes its listeners only after d.wg.Wait, so an Accept can
		// still return a connection while that Wait runs or after it
		// returned. An unguarded Add from zero there is the WaitGroup
		// misuse -race reported in TestBackoffPreventsReconnectStorm (a
		// "read" at the Serve call site against a "write" at the Shutdown
		// call site); it can also panic ("WaitGroup is reused before
		// previous Wait has returned") or leave a goroutine of the daemon
		// running after Shutdown returned.
		d.mu.Lock()
		if d.shutdown {
			d.mu.Unlock()
			_ = bc.CloseWithCode(wire.CloseShutdown, "daemon shutting down")
			return nil
		}
		d.wg.Add(1)
		d.mu.Unlock()
		go func() {
			defer d.wg.Done()
			d.ServeConn(connCtx, bc)
		}()
	}
}

// ServeConn runs the control protocol on one connection until it ends (for
// tests and relays). When ctx ends the connection is closed with
// CloseShutdown. A connection refused by admission control (Config.
// Admission) is closed at once with CloseOverloaded.
func (d *Daemon) ServeConn(ctx context.Context, bc semantics.BackendConn) {
	d.serveAdmitted(ctx, bc)
}

// Counts are the daemon's connection counts, kept up to date as
// transports come and go: reading them costs the same at any fleet size,
// unlike Sessions, which copies every transport's state.
type Counts struct {
	// Connections counts connected transports (registered or not);
	// ByBackend splits them by backend name.
	Connections int
	ByBackend   map[string]int
	// Sessions counts agent sessions with a registered current transport.
	Sessions int
}

// Counts returns the connection counts (a fresh ByBackend map).
func (d *Daemon) Counts() Counts {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := Counts{Connections: len(d.conns), Sessions: len(d.bySession), ByBackend: make(map[string]int, len(d.byBackend))}
	for b, n := range d.byBackend {
		c.ByBackend[b] = n
	}
	return c
}

// connCount is Counts().Connections without the map.
// It is an atomic load, not d.mu: AdmitEarly runs on the QUIC listener's
// packet path for every connection attempt of a herd.
func (d *Daemon) connCount() int { return int(d.nConns.Load()) }

// registeredSessions is Counts().Sessions without the map.
func (d *Daemon) registeredSessions() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.bySession)
}

// Sessions lists the transports connected to this daemon.
func (d *Daemon) Sessions() []SessionInfo {
	d.mu.Lock()
	cs := make([]*conn, 0, len(d.conns))
	for _, c := range d.conns {
		cs = append(cs, c)
	}
	d.mu.Unlock()
	out := make([]SessionInfo, 0, len(cs))
	for _, c := range cs {
		out = append(out, c.info())
	}
	return out
}

// current returns the active transport holding runner's current session.
func (d *Daemon) runnerConn(runner wire.RunnerId) *conn {
	d.mu.Lock()
	defer d.mu.Unlock()
	var best *conn
	for c := range d.byRunner[runner] {
		if _, s, _, _ := c.ident(); d.bySession[s] == c && !c.isFenced() {
			if best == nil || c.connectedAt.After(best.connectedAt) {
				best = c
			}
		}
	}
	return best
}

func (d *Daemon) sessionConn(s wire.AgentSessionId) *conn {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.bySession[s]
}

// maintenance is the background loop: lease expiry with grace and probes
// (renew.go), the log sweep (data.go) and dedup pruning.
func (d *Daemon) maintenance() {
	defer d.wg.Done()
	lastPrune := time.Time{}
	d.every(d.timing.RenewInterval, func() {
		now := d.now()
		d.expireLeases(now)
		d.sweepLogs(time.Now())
		d.probeData()
		if now.Sub(lastPrune) >= min(d.cfg.DedupRetention, time.Hour) {
			lastPrune = now
			if n, err := d.auth.PruneDedup(d.ctx, now.Add(-d.cfg.DedupRetention)); err == nil {
				d.st.dedupPruned.Add(int64(n))
			}
		}
	})
}

// every calls f every period until the daemon stops, the first time one
// period from now: the loop of the daemon's periodic goroutines
// (maintenance, retention, revocation checks).
func (d *Daemon) every(period time.Duration, f func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
		}
		f()
	}
}
