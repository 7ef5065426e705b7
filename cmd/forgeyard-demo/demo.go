package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/webtransport"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/agentsetup"
	"forgeyard.dev/transport/internal/setup/daemonsetup"
	"forgeyard.dev/transport/internal/setup/relaysetup"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/internal/tools/netsim"
	"forgeyard.dev/transport/relay"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// params are the demo's knobs; defaultParams is what `make demo` runs.
type params struct {
	Dir         string        // PKI and authority directory
	Agents      int           // agents; their roles follow agentRoles
	Leases      int           // leases dispatched (one of them is cancelled)
	MaxParallel int           // attempts per agent
	Latency     time.Duration // one-way latency added by every proxy
	Timeout     time.Duration // the whole run
	Log         *slog.Logger  // daemon and agent logs (nil: discarded)
	Progress    io.Writer     // one line per stage (nil: none)
}

func defaultParams() params {
	return params{Dir: ".demo", Agents: 5, Leases: 24, MaxParallel: 4, Latency: 2 * time.Millisecond, Timeout: 25 * time.Second}
}

// role is how an agent reaches the daemon.
type role int

const (
	roleQUIC         role = iota // QUIC through a UDP impairment proxy
	roleRelay                    // TLS+yamux through a TCP proxy to an in-process forgeyard-relay, which dials the daemon over QUIC
	roleWebTransport             // WebTransport (HTTP/3) through a UDP proxy to the daemon's WebTransport listener
	roleYamux                    // TLS+yamux through a TCP proxy to the daemon's TLS+yamux listener
)

// agentRoles are the roles of agents 1, 2, …, in this fixed order; agents
// beyond the list use QUIC. Agent 1 is the one whose path is cut (and
// whose big output upload is cut); agent 2 runs the attempt that is
// tailed live and cancelled, so it goes through the relay. A run with
// fewer agents takes a prefix: -agents 2 is QUIC + relay, 3 adds
// WebTransport, 4 direct TLS+yamux, 5 (the default) a second QUIC agent.
var agentRoles = []role{roleQUIC, roleRelay, roleWebTransport, roleYamux, roleQUIC}

func roleOf(i int) role {
	if i < len(agentRoles) {
		return agentRoles[i]
	}
	return roleQUIC
}

// Demo timing: short intervals so a cut is noticed within about 1.5 s,
// yet long enough that a starved process (the test runs under -race on a
// loaded 2-core machine) does not lose its connections: the daemon closes
// a transport after 3 missed heartbeats (1.5 s).
var demoTiming = daemon.Timing{
	HeartbeatInterval: 500 * time.Millisecond, RenewInterval: 500 * time.Millisecond, LeaseTTL: 10 * time.Second,
	RevokeGrace: 2 * time.Second, RegistrationTimeout: 5 * time.Second, RequestTimeout: 2 * time.Second, MaxBackoff: 500 * time.Millisecond,
}

// QUIC idle timeout of the agents (and of the relay's upstream): a cut
// path is detected this fast.
const (
	agentIdleTimeout    = 1500 * time.Millisecond
	agentKeepAlive      = 250 * time.Millisecond
	agentRequestTimeout = 2 * time.Second
)

// holdSpec marks the attempt the demo cancels: the demo executor runs it
// until it is cancelled (bounded by holdMax).
var holdSpec = wire.JobSpecId{Digest: sha256.Sum256([]byte("forgeyard-demo: the attempt that gets cancelled"))}

const holdMax = 20 * time.Second

// demoExecutor is the synthetic executor plus the long-running hold attempt.
// Like the synthetic executor it cannot run a command.
type demoExecutor struct {
	inner   agent.Executor
	started chan<- wire.JobAttemptId
}

func (e demoExecutor) Execute(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
	switch job.Spec {
	case holdSpec:
	case bigSpec:
		res := e.inner.Execute(ctx, job, out)
		if res.Kind == agentwire.ResultSucceeded {
			if _, err := out.PutOutput(bigOutput()); err != nil {
				return agent.Result{Kind: agentwire.ResultInfraError, Message: "storing the big output: " + err.Error()}
			}
		}
		return res
	default:
		return e.inner.Execute(ctx, job, out)
	}
	out.Phase(agentwire.PhasePreparing)
	out.Phase(agentwire.PhaseRunning)
	select {
	case e.started <- job.Attempt:
	default:
	}
	// A long build step: one log line every 100 ms until cancelled.
	end := time.NewTimer(holdMax)
	defer end.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	steps := []string{"resolving dependencies", "compiling pkg/scheduler", "compiling pkg/transport", "linking forgeyard", "running unit tests", "running integration tests"}
	for i := 0; ; i++ {
		_ = out.Log(wlogs.LogStdout, fmt.Appendf(nil, "[step %d] %s\n", i+1, steps[i%len(steps)]))
		select {
		case <-ctx.Done():
			_ = out.Log(wlogs.LogStderr, []byte("received cancellation; stopping\n"))
			return agent.Result{Kind: agentwire.ResultCancelled}
		case <-end.C:
			return agent.Result{Kind: agentwire.ResultSucceeded}
		case <-tick.C:
		}
	}
}

// latStat summarizes latency samples.
type latStat struct {
	N        int
	P50, P99 time.Duration
}

func summarize(d []time.Duration) latStat {
	if len(d) == 0 {
		return latStat{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return latStat{N: len(s), P50: q(0.50), P99: q(0.99)}
}

type agentReport struct {
	Name        string
	Runner      wire.RunnerId
	Backend     string // the agent's backend ("quic", "relay+yamux", …)
	Class       string // its fallback class, from the agent's Status
	Path        string // how it reaches the daemon
	DaemonSide  string // the transport the daemon registered it on ("quic from 127.0.0.1:x")
	Attempts    int    // accepted attempts
	Reconnects  int64
	Resyncs     int64
	Retried     int64 // completion re-sends
	DupOffers   int64 // duplicate offers answered from memory
	Cut         bool
	Connected   bool
	Completions [4]int64 // acks received, by kind
}

// report is everything the summary prints.
type report struct {
	Dir                       string
	DaemonQUIC, DaemonYamux   string
	DaemonWT                  string // WebTransport listener ("" when no agent uses it)
	Relay                     string // the relay's TLS+yamux listener ("" without a relay agent)
	RelayStats                relay.Stats
	Roles                     rolesReport // the signing worker and the device agent (roles.go)
	Agents                    []agentReport
	Stats                     daemon.Stats
	Attempts                  int            // accepted attempts
	ExactlyOnce               int            // of them, completed exactly once in the authority
	Rejections                map[string]int // offer rejections by reason (each re-offered later)
	NotConnected              int            // offers deferred while the runner was reconnecting
	CutAttempt                wire.JobAttemptId
	CutMessage                wire.MessageId
	CutRecovery               time.Duration // cut → DuplicateAccepted
	CutDuplicate              bool
	CancelAttempt             wire.JobAttemptId
	CancelResult              agentwire.ExecutionResultKind
	Data                      dataReport
	OfferAccept, ComplAck, CD latStat
	Elapsed                   time.Duration
	Pass                      bool
	Failure                   string
}

// state is the demo's event log, fed by daemon and agent hooks.
type state struct {
	mu          sync.Mutex
	changed     chan struct{} // closed and replaced on every event
	registered  map[wire.RunnerId]int
	daemonSide  map[wire.RunnerId]string  // last registration's backend and remote
	accepted    map[wire.JobAttemptId]int // attempt → agent index
	done        map[wire.JobAttemptId]agentwire.CompletionAckKind
	agentAcked  map[wire.JobAttemptId]bool // the agent received the ack
	rejections  map[string]int             // offer rejections by reason
	notConn     int                        // offers deferred while the runner was reconnecting
	results     map[wire.JobAttemptId]agentwire.ExecutionResultKind
	perRunner   map[wire.RunnerId]int
	cutRunner   wire.RunnerId
	cut         func()
	cutDone     bool
	cutAt       time.Time
	cutAttempt  wire.JobAttemptId
	cutMsg      wire.MessageId
	cutRecovery time.Duration
	cutDup      bool
	dispatched  int // lease goroutines finished
}

func newState() *state {
	return &state{changed: make(chan struct{}), registered: map[wire.RunnerId]int{}, daemonSide: map[wire.RunnerId]string{}, accepted: map[wire.JobAttemptId]int{},
		done: map[wire.JobAttemptId]agentwire.CompletionAckKind{}, agentAcked: map[wire.JobAttemptId]bool{}, rejections: map[string]int{}, results: map[wire.JobAttemptId]agentwire.ExecutionResultKind{},
		perRunner: map[wire.RunnerId]int{}}
}

// update runs f under the lock and wakes waiters.
func (s *state) update(f func()) {
	s.mu.Lock()
	f()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// waitFor waits until cond (called under the lock) holds or ctx ends.
func (s *state) waitFor(ctx context.Context, what string, cond func() bool) error {
	for {
		s.mu.Lock()
		ok, ch := cond(), s.changed
		s.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("timed out waiting for %s", what)
		}
	}
}

// onCompletion is the daemon hook. It runs after the authority committed
// and before the ack is written: the moment to cut the path so the ack is
// lost (§77, §122).
func (s *state) onCompletion(e daemon.CompletionEvent) {
	s.update(func() {
		if _, seen := s.done[e.Attempt]; !seen || e.Ack == agentwire.AckAccepted {
			s.done[e.Attempt] = e.Ack
			s.results[e.Attempt] = e.Result.Kind
		}
		s.perRunner[e.Runner]++
		if !s.cutDone && e.Runner == s.cutRunner && e.Ack == agentwire.AckAccepted && s.perRunner[e.Runner] >= 2 {
			s.cutDone, s.cutAt, s.cutAttempt, s.cutMsg = true, time.Now(), e.Attempt, e.MessageID
			s.cut()
		}
		if s.cutDone && !s.cutDup && e.MessageID == s.cutMsg && e.Ack == agentwire.AckDuplicateAccepted {
			s.cutDup, s.cutRecovery = true, time.Since(s.cutAt)
		}
	})
}

type demoAgent struct {
	name    string
	runner  wire.RunnerId
	backend string
	path    string
	a       *agent.Agent
	closer  io.Closer
	done    chan struct{}
}

// syncWriter serializes writes to w (like enginetest.SyncBuffer, which a
// command does not link: it is test plumbing).
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

func progress(p params, format string, args ...any) {
	if p.Progress != nil {
		fmt.Fprintf(p.Progress, "• "+format+"\n", args...)
	}
}

// demo is the state the scenes of runDemo share: the world they build
// (PKI, authority, data plane, daemon, relay, agents) and the report.
type demo struct {
	p     params
	log   *slog.Logger
	rep   *report
	start time.Time

	names       []string
	pki         *trust.DevPKI
	db          string
	au          authority.Authority
	serverTLS   *tls.Config
	st          *state
	holdStarted chan wire.JobAttemptId
	fsink       *logs.FileSink
	tail        *tailSink
	fstore      *cas.FSStore
	payload     wire.CasObjectRef
	cutProxy    atomic.Pointer[netsim.UDPProxy]
	store       *cutStore

	d         *daemon.Daemon
	listeners []semantics.BackendListener
	serveWG   sync.WaitGroup
	rl        *relay.Relay
	stopRelay func()

	agentCtx    context.Context
	stopAgents  context.CancelFunc
	agents      []*demoAgent
	dispatchErr error
	errOnce     sync.Once
}

// runDemo runs the whole scenario. It returns a report (possibly partial,
// with Pass false) and an error for setup failures.
func runDemo(parent context.Context, p params) (*report, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(parent, p.Timeout)
	defer cancel()
	dm := newDemo(p, start)

	// 1. Credentials and authority.
	if err := dm.credentials(ctx); err != nil {
		return nil, err
	}
	defer dm.au.Close()

	// 2. Daemon on QUIC and TLS+yamux loopback.
	err := dm.dataPlane()
	if dm.fsink != nil {
		defer dm.fsink.Close()
	}
	if err != nil {
		return nil, err
	}
	if err := dm.startDaemon(); err != nil {
		return nil, err
	}
	if err := dm.startRelay(); err != nil {
		return nil, err
	}

	// 3. Agents, each behind its own impairment proxy.
	if err := dm.startAgents(); err != nil {
		return nil, err
	}
	defer func() {
		// On early returns (timeouts), stop everything; normal path stops
		// before the authority check and sets agents to nil.
		if dm.agents != nil {
			dm.stopAll()
		}
	}()
	if err := dm.awaitRegistration(ctx); err != nil {
		return dm.rep, err
	}

	// 4. Dispatch.
	dm.dispatch(ctx)

	// 5. Tail the hold attempt's log live, then cancel it while it runs.
	if err := dm.cancelHold(ctx); err != nil {
		return dm.rep, err
	}

	// 6. Wait for every lease to be placed and completed, and for the cut
	// to be healed by a DuplicateAccepted retry.
	if err := dm.awaitCompletions(ctx); err != nil {
		return dm.rep, err
	}

	// 6b. The other peer roles (§191): a signing worker and a device agent
	// (roles.go).
	if err := dm.otherRoles(ctx); err != nil {
		return dm.rep, err
	}

	// 7. Collect, stop, check the authority and the data plane.
	dm.collect()
	return dm.check()
}

// newDemo is the demo's starting state: its logger, its empty report and
// its progress writer.
func newDemo(p params, start time.Time) *demo {
	log := p.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rep := &report{Dir: p.Dir}
	if p.Progress != nil {
		// Stages and the live tail (written by the daemon's log receiver)
		// share the writer.
		p.Progress = &syncWriter{w: p.Progress}
	}
	return &demo{p: p, log: log, rep: rep, start: start, stopRelay: func() {}}
}

// credentials is scene 1: the dev PKI and a fresh SQLite authority.
func (dm *demo) credentials(ctx context.Context) error {
	p := dm.p
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		return err
	}
	names := make([]string, p.Agents)
	for i := range names {
		names[i] = strconv.Itoa(i + 1)
	}
	dm.names = names
	pki, err := trust.GenerateDevPKI(filepath.Join(p.Dir, "pki"), trust.DevPKIOptions{Agents: names})
	if err != nil {
		return fmt.Errorf("dev PKI: %w", err)
	}
	dm.pki = pki
	created := 0
	for _, a := range pki.Agents {
		if a.Created {
			created++
		}
	}
	progress(p, "dev PKI in %s (%d agent certificates created, %d reused)", pki.Dir, created, len(names)-created)
	db := filepath.Join(p.Dir, "authority.db")
	for _, f := range []string{db, db + "-wal", db + "-shm", db + "-journal"} {
		_ = os.Remove(f)
	}
	dm.db = db
	au, err := authority.OpenSQLite(ctx, db)
	if err != nil {
		return fmt.Errorf("authority: %w", err)
	}
	dm.au = au
	return nil
}

// dataPlane is scene 2's first half: the daemon's TLS configuration, the
// event log, and the data plane the daemon will serve. dm.fsink is set as
// soon as the log sink is open, even when a later step fails.
func (dm *demo) dataPlane() error {
	p, pki := dm.p, dm.pki
	serverTLS, err := trust.ServerConfig(trust.ServerFiles{CertFile: pki.Server.CertFile, KeyFile: pki.Server.KeyFile,
		ClientCAFile: pki.CA.CertFile, RequireClientCert: true})
	if err != nil {
		return err
	}
	dm.serverTLS = serverTLS
	st := newState()
	dm.st = st
	dm.holdStarted = make(chan wire.JobAttemptId, 1)

	// The data plane: logs on disk (one attempt tailed live), a content
	// store holding the payload bundle and receiving the outputs.
	for _, sub := range []string{"logs", "cas", "spool"} {
		if err := os.RemoveAll(filepath.Join(p.Dir, sub)); err != nil {
			return err
		}
	}
	fsink, err := logs.NewFileSink(filepath.Join(p.Dir, "logs"), logs.FileSinkOptions{})
	if err != nil {
		return fmt.Errorf("log sink: %w", err)
	}
	dm.fsink = fsink
	tail := &tailSink{FileSink: fsink, out: p.Progress}
	tail.notify = func() { st.update(func() {}) }
	dm.tail = tail
	fstore, err := cas.NewFSStore(cas.FSStoreConfig{Dir: filepath.Join(p.Dir, "cas")})
	if err != nil {
		return fmt.Errorf("content store: %w", err)
	}
	dm.fstore = fstore
	payload, err := putObject(fstore, demoPayload())
	if err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	dm.payload = payload
	dm.store = &cutStore{ContentStore: fstore, big: refOf(bigOutput()), cut: func() {
		if px := dm.cutProxy.Load(); px != nil {
			px.Cut()
		}
	}}
	return nil
}

// uses reports whether any of the demo's agents has role r.
func (dm *demo) uses(r role) bool {
	for i := range dm.p.Agents {
		if roleOf(i) == r {
			return true
		}
	}
	return false
}

// startDaemon is scene 2's second half: the daemon, serving on QUIC,
// TLS+yamux and (when an agent uses it) WebTransport loopback.
func (dm *demo) startDaemon() error {
	p, pki, log, rep, st, serverTLS := dm.p, dm.pki, dm.log, dm.rep, dm.st, dm.serverTLS
	// RunnerCAs: a relayed agent's TLS ends at the relay, so the daemon
	// checks the chain the agent sends in its registration (and its key
	// proof) against the dev CA.
	runnerCAs, err := daemonsetup.RunnerCAs(pki.CA.CertFile)
	if err != nil {
		return err
	}
	d, err := daemon.New(daemon.Config{ID: "demo-daemon", Authority: dm.au, Timing: demoTiming, Features: wire.Implemented, Logger: log.With("side", "daemon"),
		RunnerCAs: runnerCAs,
		LogSink:   dm.tail, ContentStore: dm.store,
		Hooks: daemon.Hooks{
			OnRegistered: func(s daemon.SessionInfo) {
				st.update(func() { st.registered[s.Runner]++; st.daemonSide[s.Runner] = s.Backend + " from " + s.Remote })
			},
			OnCompletion: st.onCompletion,
		}})
	if err != nil {
		return err
	}
	dm.d = d
	qln, err := quic.Listen("127.0.0.1:0", serverTLS, quic.Config{Logger: log})
	if err != nil {
		return err
	}
	yln, err := yamux.Listen("127.0.0.1:0", serverTLS, yamux.Config{})
	if err != nil {
		qln.Close()
		return err
	}
	listeners := []semantics.BackendListener{qln, yln}
	rep.DaemonQUIC, rep.DaemonYamux = qln.Addr().String(), yln.Addr().String()
	if dm.uses(roleWebTransport) {
		wln, err := webtransport.Listen("127.0.0.1:0", serverTLS, quic.Config{Logger: log})
		if err != nil {
			qln.Close()
			yln.Close()
			return err
		}
		listeners = append(listeners, wln)
		rep.DaemonWT = wln.Addr().String()
	}
	dm.listeners = listeners
	for _, l := range listeners {
		dm.serveWG.Go(func() { _ = d.Serve(context.Background(), l) })
	}
	daemonURIs := "quic://" + rep.DaemonQUIC + ", yamux://" + rep.DaemonYamux
	if rep.DaemonWT != "" {
		daemonURIs += ", webtransport://" + rep.DaemonWT
	}
	progress(p, "daemon listening on %s (SQLite authority %s)", daemonURIs, dm.db)
	return nil
}

// shutdownDaemon stops the daemon and its listeners.
func (dm *demo) shutdownDaemon() {
	sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer scancel()
	_ = dm.d.Shutdown(sctx)
	for _, l := range dm.listeners {
		l.Close()
	}
	dm.serveWG.Wait()
}

// startRelay is scene 2's relay, when an agent uses it: an in-process
// forgeyard-relay.
func (dm *demo) startRelay() error {
	p, log, rep := dm.p, dm.log, dm.rep
	// An in-process forgeyard-relay: agents reach it over TLS+yamux, it
	// dials the daemon over QUIC with its own certificate (no runner URI).
	if !dm.uses(roleRelay) {
		return nil
	}
	var rc config.Relay
	if _, err := relaysetup.DevRelay(filepath.Join(p.Dir, "pki"), &rc); err != nil {
		dm.shutdownDaemon()
		return fmt.Errorf("dev relay certificate: %w", err)
	}
	rc.Upstream.ServerName = "localhost"
	upTLS, err := relaysetup.RelayUpstreamTLS(rc.Upstream)
	if err != nil {
		dm.shutdownDaemon()
		return err
	}
	relayTLS, err := serversetup.ServerTLS(rc.TLS)
	if err != nil {
		dm.shutdownDaemon()
		return err
	}
	rl, err := relay.New(relay.Config{Upstreams: []string{rep.DaemonQUIC}, UpstreamTLS: upTLS,
		UpstreamQUIC: quic.Config{MaxIdleTimeout: agentIdleTimeout, KeepAlivePeriod: agentKeepAlive, Logger: log},
		Logger:       log.With("side", "relay")})
	if err != nil {
		dm.shutdownDaemon()
		return err
	}
	dm.rl = rl
	rln, err := yamux.Listen("127.0.0.1:0", relayTLS, yamux.Config{})
	if err != nil {
		dm.shutdownDaemon()
		return err
	}
	rep.Relay = rln.Addr().String()
	relayDone := make(chan struct{})
	go func() { defer close(relayDone); _ = rl.Serve(context.Background(), rln) }()
	dm.stopRelay = func() {
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer scancel()
		_ = rl.Shutdown(sctx) // closes rln
		<-relayDone
	}
	progress(p, "forgeyard-relay listening on yamux://%s, relaying to the daemon over quic://%s", rep.Relay, rep.DaemonQUIC)
	return nil
}

// stopAll stops the agents, the relay, the daemon and the agents' proxies.
func (dm *demo) stopAll() {
	dm.stopAgents()
	grace := time.NewTimer(5 * time.Second)
	defer grace.Stop()
	for _, da := range dm.agents {
		select {
		case <-da.done:
		case <-grace.C:
			dm.log.Warn("agent did not stop within 5s", "agent", da.name)
		}
		da.a.Close()
	}
	dm.stopRelay()
	dm.shutdownDaemon()
	for _, da := range dm.agents {
		da.closer.Close()
	}
}

// startAgents is scene 3: the agents, each behind its own impairment
// proxy; agent 1's proxy is the one the cut severs.
func (dm *demo) startAgents() error {
	dm.agentCtx, dm.stopAgents = context.WithCancel(context.Background())
	imp := netsim.Impairment{Latency: dm.p.Latency}
	for i, name := range dm.names {
		if err := dm.startAgent(i, name, imp); err != nil {
			return err
		}
	}
	st := dm.st
	st.update(func() {
		st.cutRunner = dm.agents[0].runner
		st.cut = func() { dm.cutProxy.Load().Cut() }
	})
	return nil
}

// startAgent is scene 3 for agent i: its credential, its proxy, its
// endpoint and the running agent. On failure everything started so far
// is stopped.
func (dm *demo) startAgent(i int, name string, imp netsim.Impairment) error {
	p, pki, log, rep, st := dm.p, dm.pki, dm.log, dm.rep, dm.st
	ag, _ := pki.Agent(name)
	cred, err := agentsetup.LoadCredential(config.ControlPlane{ServerName: "localhost",
		Credential: config.Credential{Certificate: ag.CertFile, PrivateKey: ag.KeyFile, CA: pki.CA.CertFile}})
	if err != nil {
		dm.stopAll()
		return err
	}
	da := &demoAgent{name: name, runner: cred.Runner, done: make(chan struct{})}
	// Each agent reaches its target through its own impairment proxy
	// (UDP for QUIC and WebTransport, TCP for TLS+yamux).
	var ep config.Endpoint
	var px interface {
		io.Closer
		Addr() string
	}
	switch r := roleOf(i); r {
	case roleQUIC, roleWebTransport:
		target, backend := rep.DaemonQUIC, config.BackendQUIC
		if r == roleWebTransport {
			target, backend = rep.DaemonWT, config.BackendWebTransport
		}
		up, err := netsim.NewUDPProxy(target, netsim.Options{Up: imp, Down: imp, Seed: uint64(i + 1)})
		if err != nil {
			dm.stopAll()
			return err
		}
		if i == 0 {
			dm.cutProxy.Store(up)
		}
		px, ep = up, config.Endpoint{Backend: backend, HostPort: up.Addr()}
		da.path = "udp proxy " + up.Addr() + " → " + backend + " " + target
	case roleRelay, roleYamux:
		target := rep.DaemonYamux
		if r == roleRelay {
			target = rep.Relay
		}
		tp, err := netsim.NewTCPProxy(target, netsim.Options{Up: imp, Down: imp, Seed: uint64(i + 1)})
		if err != nil {
			dm.stopAll()
			return err
		}
		px, ep = tp, config.Endpoint{Backend: config.BackendYamux, HostPort: tp.Addr(), Relay: r == roleRelay}
		if r == roleRelay {
			da.path = "tcp proxy " + tp.Addr() + " → relay " + target + " → quic " + rep.DaemonQUIC
		} else {
			da.path = "tcp proxy " + tp.Addr() + " → yamux " + target
		}
	}
	da.closer = px
	// The same endpoint construction as forgeyard-agent's (fallback
	// class, backend name "relay+yamux" for the relay).
	aep, err := agentsetup.Endpoint(ep, agentsetup.EndpointOptions{TLS: cred.Client,
		QUIC: quic.Config{MaxIdleTimeout: agentIdleTimeout, KeepAlivePeriod: agentKeepAlive, Logger: log}})
	if err != nil {
		px.Close()
		dm.stopAll()
		return err
	}
	da.backend = aep.Backend
	a, err := agent.New(agent.Config{
		Runner: cred.Runner, Signer: cred.Signer, CertChain: cred.CertChain,
		Endpoints: []agent.Endpoint{aep},
		Role:      agentwire.RoleAgent,
		Features:  wire.Implemented,
		Executor: demoExecutor{inner: agent.NewSyntheticExecutor(uint64(i+1), agent.SyntheticOptions{MinDuration: 40 * time.Millisecond, MaxDuration: 250 * time.Millisecond}),
			started: dm.holdStarted},
		MaxParallel: p.MaxParallel, Backoff: agent.Backoff{Base: 50 * time.Millisecond, Max: 500 * time.Millisecond},
		SpoolDir: filepath.Join(p.Dir, "spool", name), FetchPayload: true,
		RequestTimeout: agentRequestTimeout, Logger: log.With("side", "agent", "agent", name), Version: "forgeyard-demo/1",
		Hooks: agent.Hooks{OnAttemptDone: func(ad agent.AttemptDone) {
			st.update(func() { st.agentAcked[ad.Job.Attempt] = true })
		}, OnAttemptStarted: func(j agent.Job) {
			if j.Spec == holdSpec {
				dm.tail.follow(j.Attempt, name) // before its first log line
			}
		}},
	})
	if err != nil {
		da.closer.Close()
		dm.stopAll()
		return err
	}
	da.a = a
	dm.agents = append(dm.agents, da)
	go func() { defer close(da.done); _ = a.Run(dm.agentCtx) }()
	return nil
}

// awaitRegistration is scene 3's end: every agent registered, counted by
// backend.
func (dm *demo) awaitRegistration(ctx context.Context) error {
	p, st := dm.p, dm.st
	if err := st.waitFor(ctx, "agents to register", func() bool { return len(st.registered) == p.Agents }); err != nil {
		return err
	}
	byBackend := map[string]int{}
	var order []string
	for _, da := range dm.agents {
		if byBackend[da.backend] == 0 {
			order = append(order, da.backend)
		}
		byBackend[da.backend]++
	}
	var parts []string
	for _, b := range order {
		parts = append(parts, fmt.Sprintf("%d %s", byBackend[b], b))
	}
	progress(p, "%d agents registered (%s; each through its own impairment proxy, +%v one-way latency)", p.Agents, strings.Join(parts, ", "), p.Latency)
	return nil
}

// dispatch is scene 4: the leases offered to the agents, each by its own
// goroutine.
func (dm *demo) dispatch(ctx context.Context) {
	p, st := dm.p, dm.st
	// Lease 0 is the hold attempt, on agent 2 (never the cut agent); the
	// others are spread round-robin.
	// A tiny scheduler: at most MaxParallel leases in flight per agent (a
	// slot is freed when the agent has its completion ack), at most
	// Agents×MaxParallel dispatch goroutines.
	sem := make(chan struct{}, p.Agents*p.MaxParallel)
	slots := make([]chan struct{}, p.Agents)
	for i := range slots {
		slots[i] = make(chan struct{}, p.MaxParallel)
	}
	for i := 0; i < p.Leases; i++ {
		idx := i % p.Agents
		spec := wire.JobSpecId{Digest: sha256.Sum256([]byte("forgeyard-demo spec " + strconv.Itoa(i)))}
		switch i {
		case 0:
			idx, spec = 1, holdSpec
		case 1:
			idx, spec = 0, bigSpec
		}
		da := dm.agents[idx]
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; st.update(func() { st.dispatched++ }) }()
			dm.placeLease(ctx, idx, da, spec, slots[idx])
		}()
	}
	progress(p, "dispatching %d leases (payload download → offer → accept → phases → log stream → output upload → completion, synthetic executor 40–250 ms)", p.Leases)
}

// placeLease is scene 4 for one lease: it takes a slot of agent idx, offers
// the lease until it is accepted (counting the rejections) and holds the
// slot until the agent has its completion ack.
func (dm *demo) placeLease(ctx context.Context, idx int, da *demoAgent, spec wire.JobSpecId, slot chan struct{}) {
	st := dm.st
	select {
	case slot <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-slot }()
	for {
		l, err := dm.d.OfferLease(ctx, da.runner, daemon.LeaseOffer{Job: wire.NewJobId(), Spec: spec, Payload: dm.payload})
		if err == nil {
			st.update(func() { st.accepted[l.Attempt] = idx })
			_ = st.waitFor(ctx, "", func() bool { return st.agentAcked[l.Attempt] })
			return
		}
		var rej *daemon.RejectedError
		if ctx.Err() != nil || !(errors.Is(err, daemon.ErrNotConnected) || errors.As(err, &rej) || errors.Is(err, daemon.ErrOfferExpired) || errors.Is(err, daemon.ErrLeaseRevoked)) {
			dm.errOnce.Do(func() { dm.dispatchErr = fmt.Errorf("offer to agent %s: %w", da.name, err) })
			return
		}
		// Count without waking other waiters, then wait: for a
		// capacity rejection, until something changes (a completion
		// frees a slot); while the runner reconnects, a short pause.
		st.mu.Lock()
		wait := st.changed
		switch {
		case rej != nil:
			st.rejections[rej.Reason.String()]++
		case errors.Is(err, daemon.ErrNotConnected):
			st.notConn++
			wait = nil
		case errors.Is(err, daemon.ErrLeaseRevoked):
			st.rejections["lease revoked"]++
		default:
			st.rejections["offer expired"]++
		}
		st.mu.Unlock()
		select {
		case <-wait:
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// cancelHold is scene 5: the hold attempt's log tailed live, then the
// attempt cancelled while it runs.
func (dm *demo) cancelHold(ctx context.Context) error {
	select {
	case att := <-dm.holdStarted:
		dm.rep.CancelAttempt = att
		if err := dm.st.waitFor(ctx, "the tailed attempt's log", func() bool { return dm.tail.Lines() >= 8 }); err != nil {
			return err
		}
		if err := dm.d.CancelAttempt(ctx, att, agentwire.CancelUserRequested); err != nil {
			return fmt.Errorf("cancel: %w", err)
		}
		progress(dm.p, "cancelled attempt %s on agent %s while running", att, dm.agents[1].name)
	case <-ctx.Done():
		return errors.New("timed out waiting for the attempt to cancel to start")
	}
	return nil
}

// awaitCompletions is scene 6: every lease placed and completed, and the
// cut healed by a DuplicateAccepted retry (and the cut upload resumed).
func (dm *demo) awaitCompletions(ctx context.Context) error {
	p, st := dm.p, dm.st
	if err := st.waitFor(ctx, "all leases to be dispatched", func() bool { return st.dispatched == p.Leases }); err != nil {
		return err
	}
	if dm.dispatchErr != nil {
		return dm.dispatchErr
	}
	if err := st.waitFor(ctx, "all attempts to complete and their acks to arrive", func() bool {
		for att := range st.accepted {
			if _, ok := st.done[att]; !ok || !st.agentAcked[att] {
				return false
			}
		}
		return true
	}); err != nil {
		return err
	}
	if err := st.waitFor(ctx, "the cut agent's completion retry", func() bool { return st.cutDup }); err != nil {
		return err
	}
	progress(p, "agent %s: path cut after the daemon committed a completion; reconnected, resynced, retry answered DuplicateAccepted", dm.agents[0].name)
	if cut := dm.store.cutAt(); cut > 0 {
		cs := dm.d.CASServer().Stats()
		progress(p, "agent %s: path cut while uploading an %d MiB output at %.1f MiB; the upload resumed from the daemon's verified prefix (%d resumed, %.1f MiB not re-sent)",
			dm.agents[0].name, bigOutputSize>>20, float64(cut)/(1<<20), cs.ResumedUploads, float64(cs.ResumedPrefixBytes)/(1<<20))
	}
	return nil
}

// otherRoles is scene 6b: a signing worker and a device agent (roles.go).
func (dm *demo) otherRoles(ctx context.Context) error {
	rr, err := runRoles(ctx, dm.p, dm.pki, dm.d, dm.rep.DaemonQUIC, dm.fstore, dm.payload, dm.log)
	dm.rep.Roles = rr
	if err != nil {
		return fmt.Errorf("signing worker / device agent: %w", err)
	}
	return nil
}

// collect is scene 7's first half: the daemon's, relay's, data plane's and
// agents' statistics into the report, then everything stopped.
func (dm *demo) collect() {
	rep, st := dm.rep, dm.st
	rep.Stats = dm.d.Stats()
	if dm.rl != nil {
		rep.RelayStats = dm.rl.Stats()
	}
	rep.Data = collectData(dm.d, dm.store, dm.tail, dm.agents, st)
	for i, da := range dm.agents {
		as, status := da.a.Stats(), da.a.Status()
		ar := agentReport{Name: da.name, Runner: da.runner, Backend: da.backend, Class: status.Class, Path: da.path, Reconnects: as.Reconnects,
			Resyncs: as.Resyncs, Retried: as.CompletionsRetried, DupOffers: as.DuplicatesAbsorbed, Cut: i == 0,
			Connected: status.Connected, Completions: as.CompletionAcks}
		st.mu.Lock()
		ar.DaemonSide = st.daemonSide[da.runner]
		if roleOf(i) == roleRelay && ar.DaemonSide != "" {
			ar.DaemonSide += " (the relay)"
		}
		for _, idx := range st.accepted {
			if idx == i {
				ar.Attempts++
			}
		}
		st.mu.Unlock()
		rep.Agents = append(rep.Agents, ar)
	}
	dm.stopAll()
	dm.agents = nil
}

// check is scene 7's second half: the authority and the paths checked, and
// the verdict.
func (dm *demo) check() (*report, error) {
	p, rep, st := dm.p, dm.rep, dm.st
	st.mu.Lock()
	attempts := slices.Collect(func(yield func(wire.JobAttemptId) bool) {
		for a := range st.accepted {
			if !yield(a) {
				return
			}
		}
	})
	rep.CutAttempt, rep.CutMessage, rep.CutRecovery, rep.CutDuplicate = st.cutAttempt, st.cutMsg, st.cutRecovery, st.cutDup
	rep.CancelResult = st.results[rep.CancelAttempt]
	st.mu.Unlock()
	rep.Rejections, rep.NotConnected = st.rejections, st.notConn
	rep.Attempts = len(attempts)
	wrongPath := dm.wrongPaths()
	var bad []string
	for _, att := range attempts {
		n, err := dm.au.Completions(context.Background(), att)
		if err != nil {
			return rep, fmt.Errorf("authority check: %w", err)
		}
		if n == 1 {
			rep.ExactlyOnce++
		} else {
			bad = append(bad, fmt.Sprintf("%s: %d completions", att, n))
		}
	}
	rep.OfferAccept, rep.ComplAck, rep.CD = summarize(rep.Stats.OfferToAccept), summarize(rep.Stats.CompletionToAck), summarize(rep.Stats.CancelDelivery)
	rep.Elapsed = time.Since(dm.start)
	switch {
	case rep.Attempts != p.Leases:
		rep.Failure = fmt.Sprintf("%d of %d leases accepted", rep.Attempts, p.Leases)
	case len(bad) > 0:
		rep.Failure = fmt.Sprintf("attempts not completed exactly once: %v", bad)
	case !rep.CutDuplicate:
		rep.Failure = "the cut completion was not retried with DuplicateAccepted"
	case rep.CancelResult != agentwire.ResultCancelled:
		rep.Failure = fmt.Sprintf("the cancelled attempt ended %v, not Cancelled", rep.CancelResult)
	case rep.Data.Failure != "":
		rep.Failure = rep.Data.Failure
	case len(wrongPath) > 0:
		rep.Failure = strings.Join(wrongPath, "; ")
	case rep.Roles.Failure != "":
		rep.Failure = rep.Roles.Failure
	default:
		rep.Pass = true
	}
	return rep, nil
}

// wrongPaths is scene 7's path check: the agents that did not reach the
// daemon the way their role says, and a relay that carried nothing.
func (dm *demo) wrongPaths() []string {
	rep := dm.rep
	// Every agent must have reached the daemon the way its role says: the
	// relayed one on the relay's QUIC connection, from the relay.
	var wrongPath []string
	for i, ar := range rep.Agents {
		want := map[role]string{roleQUIC: "quic", roleRelay: "quic", roleWebTransport: "webtransport", roleYamux: "yamux"}[roleOf(i)]
		if !strings.HasPrefix(ar.DaemonSide, want+" from ") {
			wrongPath = append(wrongPath, fmt.Sprintf("agent %s (%s): daemon saw %q, want %s", ar.Name, ar.Backend, ar.DaemonSide, want))
		}
	}
	if dm.rl != nil && (rep.RelayStats.Accepted < 1 || rep.RelayStats.BytesToDaemon == 0 || rep.RelayStats.BytesToAgent == 0) {
		wrongPath = append(wrongPath, fmt.Sprintf("the relay carried nothing: %+v", rep.RelayStats))
	}
	return wrongPath
}
