package loadgen

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/webtransport"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// Backends the fleet dials.
var Backends = []string{"quic", "yamux", "webtransport"}

// FleetOptions shape a fleet. Zero values are defaults.
type FleetOptions struct {
	Backend string // "quic", "yamux" or "webtransport"
	Addr    string // the daemon's listener for Backend (host:port)
	PKI     *PKI   // N = len(PKI.Runners)
	// Ramp spreads the agents' starts evenly over this duration; 0 starts
	// them all at once (the herd).
	Ramp time.Duration
	// SourceAddrs spreads the agents over 127.0.0.1 …
	// 127.0.0.<SourceAddrs> (0: 1, at most 254): TCP (yamux) agents bind
	// their address, QUIC agents share one UDP socket (a backends/quic
	// Transport) per address. WebTransport agents dial from a fresh
	// 0.0.0.0:0 socket each (backends/webtransport has no shared-socket
	// option).
	SourceAddrs int
	// SpoolDir holds the agents' spools (removed by Close).
	SpoolDir string
	// Exec shapes the synthetic executor.
	Exec agent.SyntheticOptions
	// RequestTimeout is each agent's request deadline (0: the agent's
	// default).
	RequestTimeout time.Duration
	// Progress receives one line a second while the fleet runs (nil: none).
	Progress io.Writer
	// SessionResumption gives each agent its own TLS session cache, as
	// forgeyard-agent has by default (issue 25 item 4): reconnections
	// after a restart resume. Off by default so that figures stay
	// comparable with earlier runs (every connection a full handshake).
	SessionResumption bool
}

// Fleet is N library agents in this process.
type Fleet struct {
	o          FleetOptions
	metrics    *telemetry.Metrics
	members    []*member
	transports []*quic.Transport // QUIC: one shared socket per source address
	gate       dialGate          // holds dials during a restart (Options.RedialHold)
	start      time.Time
	ctx        context.Context
	cancel     context.CancelFunc
	wg         sync.WaitGroup

	connected atomic.Int64 // members registered right now
	attempts  atomic.Int64 // dials
	failed    atomic.Int64 // failed attempts (dial, hello or registration)
	drops     atomic.Int64 // disconnects while no restart was under way
	regs      []atomic.Int64
	restart   atomic.Bool

	mu       sync.Mutex
	reasons  map[string]int64
	warnings map[string]int64
	rounds   []*Round
	runs     map[wire.JobAttemptId]int
	acks     map[wire.JobAttemptId]*[4]int
	cancels  map[wire.JobAttemptId]agentwire.CancellationReason
	rounding atomic.Pointer[Round]
}

// maxSeconds bounds the per-second registration counters.
const maxSeconds = 4 * 3600

type member struct {
	i         int
	a         *agent.Agent
	connected atomic.Bool
	failing   atomic.Bool // the latest attempt since the last registration failed
	attempts  atomic.Int64
	round     atomic.Int64 // the last round it registered in
	noticed   atomic.Int64 // the last round whose disconnect it noticed
	done      chan struct{}
}

// Round is one wait for every agent to register: the cold start, or the
// time after a daemon restart.
type Round struct {
	ID      int64
	Name    string
	Start   time.Time
	pending atomic.Int64
	done    chan struct{}
	doneAt  atomic.Int64 // unix nanoseconds
	mu      sync.Mutex
	notice  []time.Duration // restart rounds: start → the agent's disconnect
}

// Done is closed when every agent registered in this round.
func (r *Round) Done() <-chan struct{} { return r.done }

// Took is the time from the round's start to its last registration (0
// while pending).
func (r *Round) Took() time.Duration {
	if t := r.doneAt.Load(); t != 0 {
		return time.Unix(0, t).Sub(r.Start)
	}
	return 0
}

// Pending is the number of agents not yet registered in the round.
func (r *Round) Pending() int64 { return r.pending.Load() }

// Notice returns the sorted times from the round's start to each agent's
// noticing that its link ended (restart rounds).
func (r *Round) Notice() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]time.Duration(nil), r.notice...)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// NewFleet builds the agents (not started).
func NewFleet(o FleetOptions) (*Fleet, error) {
	n := len(o.PKI.Runners)
	if o.SourceAddrs <= 0 {
		o.SourceAddrs = 1
	}
	if o.SourceAddrs > 254 {
		return nil, errors.New("loadgen: at most 254 source addresses (127.0.0.1–127.0.0.254)")
	}
	if o.SpoolDir == "" {
		return nil, errors.New("loadgen: FleetOptions.SpoolDir is required")
	}
	f := &Fleet{o: o, metrics: telemetry.NewMetrics(), regs: make([]atomic.Int64, maxSeconds), reasons: map[string]int64{}, warnings: map[string]int64{},
		runs: map[wire.JobAttemptId]int{}, acks: map[wire.JobAttemptId]*[4]int{}, cancels: map[wire.JobAttemptId]agentwire.CancellationReason{}}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	if o.Backend == "quic" {
		for a := range o.SourceAddrs {
			tr, err := quic.NewTransport(fmt.Sprintf("127.0.0.%d:0", 1+a))
			if err != nil {
				f.closeTransports()
				return nil, err
			}
			f.transports = append(f.transports, tr)
		}
	}
	exec := agent.NewSyntheticExecutor(1, o.Exec)
	for i := range n {
		m := &member{i: i, done: make(chan struct{})}
		d, addr, err := f.dialer(i)
		if err != nil {
			return nil, err
		}
		r := o.PKI.Runners[i]
		cfg := agent.Config{Runner: r.ID, Signer: r.Cert.PrivateKey.(crypto.Signer), CertChain: r.Cert.Certificate,
			Endpoints: []agent.Endpoint{{Address: addr, Dialer: &countingDialer{inner: d, f: f, m: m}, Backend: o.Backend}},
			Executor:  &countingExec{inner: exec, f: f}, MaxParallel: 4, RequestTimeout: o.RequestTimeout,
			Features: wire.Implemented, Logger: slog.New(&failureHandler{f: f, m: m}), Metrics: f.metrics,
			SpoolDir: filepath.Join(o.SpoolDir, fmt.Sprintf("a%d", i)), Version: "forgeyard-loadgen",
			Hooks: agent.Hooks{
				OnConnected:    func(agent.Status) { f.onConnected(m) },
				OnDisconnected: func(error) { f.onDisconnected(m) },
				OnAttemptDone:  f.onAttemptDone,
				OnCancel:       f.onCancel,
			}}
		a, err := agent.New(cfg)
		if err != nil {
			return nil, err
		}
		m.a = a
		f.members = append(f.members, m)
	}
	return f, nil
}

func (f *Fleet) dialer(i int) (semantics.BackendDialer, string, error) {
	tc := f.o.PKI.ClientTLS(i)
	if f.o.SessionResumption {
		// Agent i's own cache: its dialer clones tc, so every redial of
		// this agent shares it, and no other agent's does.
		leaf := f.o.PKI.Runners[i].Cert.Leaf
		tc.ClientSessionCache = trust.NewSessionCache(func() *x509.Certificate { return leaf })
	}
	switch f.o.Backend {
	case "quic":
		return quic.Dialer{TLS: tc, Transport: f.transports[i%len(f.transports)],
			Config: quic.Config{RefusalBackoff: quic.DefaultRefusalBackoff}}, f.o.Addr, nil
	case "webtransport":
		return webtransport.Dialer{TLS: tc}, webtransport.URL(f.o.Addr), nil
	case "yamux":
		src := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+i%f.o.SourceAddrs))}
		nd := &net.Dialer{LocalAddr: src}
		return yamux.Dialer{TLS: tc, DialContext: nd.DialContext}, f.o.Addr, nil
	}
	return nil, "", fmt.Errorf("loadgen: unknown backend %q (quic, yamux, webtransport)", f.o.Backend)
}

// N is the fleet's size.
func (f *Fleet) N() int { return len(f.members) }

// Start starts the agents (evenly over Ramp) and returns the cold-start
// round; agents keep being started in the background while it ramps.
func (f *Fleet) Start() *Round {
	f.start = time.Now()
	r := f.BeginRound("cold start")
	f.wg.Go(func() {
		n := len(f.members)
		for i, m := range f.members {
			if f.o.Ramp > 0 && i > 0 {
				at := f.start.Add(time.Duration(int64(f.o.Ramp) * int64(i) / int64(n)))
				if d := time.Until(at); d > 0 {
					t := time.NewTimer(d)
					select {
					case <-t.C:
					case <-f.ctx.Done():
						t.Stop()
						return
					}
				}
			}
			f.wg.Go(func() {
				defer close(m.done)
				_ = m.a.Run(f.ctx)
			})
		}
	})
	if f.o.Progress != nil {
		f.wg.Go(f.progress)
	}
	return r
}

// BeginRound starts waiting for every agent to register again (call it
// right before a daemon restart). Agents' disconnects from now on are part
// of the restart, not drops.
func (f *Fleet) BeginRound(name string) *Round {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := &Round{ID: int64(len(f.rounds) + 1), Name: name, Start: time.Now(), done: make(chan struct{})}
	r.pending.Store(int64(len(f.members)))
	f.rounds = append(f.rounds, r)
	f.rounding.Store(r)
	f.restart.Store(r.ID > 1)
	return r
}

func (f *Fleet) onConnected(m *member) {
	now := time.Now()
	m.connected.Store(true)
	m.failing.Store(false)
	f.connected.Add(1)
	if s := int(now.Sub(f.start) / time.Second); s >= 0 && s < maxSeconds {
		f.regs[s].Add(1)
	}
	r := f.rounding.Load()
	if r != nil && m.round.Swap(r.ID) != r.ID {
		if r.pending.Add(-1) == 0 {
			r.doneAt.Store(now.UnixNano())
			close(r.done)
			f.restart.Store(false)
		}
	}
}

func (f *Fleet) onDisconnected(m *member) {
	if m.connected.Swap(false) {
		f.connected.Add(-1)
	}
	r := f.rounding.Load()
	if f.restart.Load() && r != nil && m.noticed.Swap(r.ID) != r.ID {
		r.mu.Lock()
		r.notice = append(r.notice, time.Since(r.Start))
		r.mu.Unlock()
		return
	}
	if f.ctx.Err() == nil {
		f.drops.Add(1)
	}
}

func (f *Fleet) onAttemptDone(d agent.AttemptDone) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.acks[d.Job.Attempt]
	if a == nil {
		a = &[4]int{}
		f.acks[d.Job.Attempt] = a
	}
	if int(d.Ack) < len(a) {
		a[d.Ack]++
	}
}

func (f *Fleet) onCancel(a wire.JobAttemptId, r agentwire.CancellationReason) {
	f.mu.Lock()
	f.cancels[a] = r
	f.mu.Unlock()
}

// countingDialer counts connection attempts per agent.
type countingDialer struct {
	inner semantics.BackendDialer
	f     *Fleet
	m     *member
}

func (d *countingDialer) Dial(ctx context.Context, addr string) (semantics.BackendConn, error) {
	if err := d.f.gate.wait(ctx); err != nil {
		return nil, err
	}
	d.m.attempts.Add(1)
	d.f.attempts.Add(1)
	return d.inner.Dial(ctx, addr)
}

// dialGate holds the fleet's dials while it is closed (Options.RedialHold).
// The zero value is open.
type dialGate struct {
	mu   sync.Mutex
	shut chan struct{} // nil: open; closed by release
}

// hold closes the gate: later dials wait for release.
func (g *dialGate) hold() {
	g.mu.Lock()
	if g.shut == nil {
		g.shut = make(chan struct{})
	}
	g.mu.Unlock()
}

// release opens the gate and lets the waiting dials go.
func (g *dialGate) release() {
	g.mu.Lock()
	if g.shut != nil {
		close(g.shut)
		g.shut = nil
	}
	g.mu.Unlock()
}

// wait returns once the gate is open, or ctx's error.
func (g *dialGate) wait(ctx context.Context) error {
	g.mu.Lock()
	shut := g.shut
	g.mu.Unlock()
	if shut == nil {
		return nil
	}
	select {
	case <-shut:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// countingExec counts executions per attempt (a second run of one attempt
// is a duplicate).
type countingExec struct {
	inner agent.Executor
	f     *Fleet
}

func (e *countingExec) Execute(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
	e.f.mu.Lock()
	e.f.runs[job.Attempt]++
	e.f.mu.Unlock()
	return e.inner.Execute(ctx, job, out)
}

// failureHandler is each agent's slog handler: it counts the agent's
// "endpoint failed" records (a failed dial, hello or registration: the
// agent logs each one) by reason, and its warnings by message; it writes
// nothing.
type failureHandler struct {
	f *Fleet
	m *member
}

func (h *failureHandler) Enabled(_ context.Context, l slog.Level) bool { return true }
func (h *failureHandler) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *failureHandler) WithGroup(string) slog.Handler                { return h }

func (h *failureHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "endpoint failed" {
		if r.Level >= slog.LevelWarn {
			h.f.mu.Lock()
			h.f.warnings[r.Message]++
			h.f.mu.Unlock()
		}
		return nil
	}
	var err error
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			err, _ = a.Value.Any().(error)
			return false
		}
		return true
	})
	h.m.failing.Store(true)
	h.f.failed.Add(1)
	reason := FailureReason(err)
	h.f.mu.Lock()
	h.f.reasons[reason]++
	h.f.mu.Unlock()
	return nil
}

// FailureReason names why a connection attempt failed, for the table.
func FailureReason(err error) string {
	var re *agent.RejectedError
	var ce *semantics.ConnError
	var ne net.Error
	switch {
	case err == nil:
		return "unknown"
	case errors.As(err, &re):
		return "rejected: " + re.Code.String()
	case errors.As(err, &ce):
		side := "local"
		if ce.Remote {
			side = "daemon"
		}
		return fmt.Sprintf("closed by %s: %v", side, ce.Code)
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return "too many open files"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return "no free source port"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "closed (EOF)"
	}
	return "other"
}

// progress prints one line a second until the fleet closes.
func (f *Fleet) progress() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var lastFailed int64
	for {
		select {
		case <-f.ctx.Done():
			return
		case <-t.C:
		}
		p := f.Snapshot()
		r := f.rounding.Load()
		fmt.Fprintf(f.o.Progress, "loadgen %6.1fs  %-14s registered %d/%d  connecting %d  retrying %d  failed attempts %d (+%d)  attempts %d\n",
			time.Since(f.start).Seconds(), r.Name, p.Registered, f.N(), p.Connecting, p.Retrying, p.FailedAttempts, p.FailedAttempts-lastFailed, p.Attempts)
		lastFailed = p.FailedAttempts
	}
}

// Progress is the fleet's state at one moment.
type Progress struct {
	Registered, Connecting, Retrying int
	Attempts, FailedAttempts         int64
}

// Snapshot counts the members by state.
func (f *Fleet) Snapshot() Progress {
	var p Progress
	for _, m := range f.members {
		switch {
		case m.connected.Load():
			p.Registered++
		case m.failing.Load():
			p.Retrying++
		case m.attempts.Load() > 0:
			p.Connecting++
		}
	}
	p.Attempts, p.FailedAttempts = f.attempts.Load(), f.failed.Load()
	return p
}

// AgentStats sums the agents' counters.
func (f *Fleet) AgentStats() agent.Stats {
	var s agent.Stats
	for _, m := range f.members {
		a := m.a.Stats()
		s.Reconnects += a.Reconnects
		s.Registrations += a.Registrations
		s.HeartbeatsSent += a.HeartbeatsSent
		s.HeartbeatsAcked += a.HeartbeatsAcked
		s.HeartbeatTimeouts += a.HeartbeatTimeouts
		s.RestartHints += a.RestartHints
		s.RestartHintTimeouts += a.RestartHintTimeouts
		s.RestartTokens += a.RestartTokens
		s.RestartTokenEnds += a.RestartTokenEnds
		s.DialFailures += a.DialFailures
		s.LeasesAccepted += a.LeasesAccepted
		s.LeasesRejected += a.LeasesRejected
		s.AttemptsStarted += a.AttemptsStarted
		s.CompletionsSent += a.CompletionsSent
		s.CompletionsRetried += a.CompletionsRetried
		s.DuplicatesAbsorbed += a.DuplicatesAbsorbed
		s.OutputsUploaded += a.OutputsUploaded
		s.LogFinalizeFailed += a.LogFinalizeFailed
		s.OutputsFailed += a.OutputsFailed
		for i := range a.CompletionAcks {
			s.CompletionAcks[i] += a.CompletionAcks[i]
		}
	}
	return s
}

// Runners returns the RunnerIds of the registered agents.
func (f *Fleet) Runners() []wire.RunnerId {
	out := make([]wire.RunnerId, 0, len(f.members))
	for _, m := range f.members {
		if m.connected.Load() {
			out = append(out, f.o.PKI.Runners[m.i].ID)
		}
	}
	return out
}

// HeartbeatHistogram is the agents' heartbeat round trips
// (forgeyard_heartbeat_rtt_seconds of their shared metrics).
func (f *Fleet) HeartbeatHistogram() Histogram {
	return gatherHistogram(f.metrics, "forgeyard_heartbeat_rtt_seconds")
}

func gatherHistogram(m *telemetry.Metrics, name string) Histogram {
	var h Histogram
	mfs, err := m.Registry().Gather()
	if err != nil {
		return h
	}
	for _, mf := range mfs {
		if mf.GetName() != name || len(mf.GetMetric()) == 0 {
			continue
		}
		ph := mf.GetMetric()[0].GetHistogram()
		for _, b := range ph.GetBucket() {
			h.Bounds = append(h.Bounds, b.GetUpperBound())
			h.Cum = append(h.Cum, b.GetCumulativeCount())
		}
		h.Count = ph.GetSampleCount()
	}
	return h
}

// Outcome is what happened to the leases the agents ran.
type Outcome struct {
	Attempts   int // distinct attempts executed or acknowledged
	Accepted   int // attempts with exactly one Accepted completion ack
	DupAcks    int // DuplicateAccepted acks (a re-sent completion absorbed)
	Stale      int // attempts answered StaleRejected or InvalidRejected
	Duplicated int // attempts executed twice, or recorded (Accepted) twice
}

// Outcomes counts the attempts' executions and completion acks; done
// holds the attempts (ULID strings) whose completion was recorded.
func (f *Fleet) Outcomes() (Outcome, map[string]bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var o Outcome
	done := map[string]bool{}
	seen := map[wire.JobAttemptId]bool{}
	for a, n := range f.runs {
		seen[a] = true
		if n > 1 {
			o.Duplicated++
		}
	}
	for a, k := range f.acks {
		if !seen[a] {
			seen[a] = true
		}
		o.DupAcks += k[agentwire.AckDuplicateAccepted]
		switch {
		case k[agentwire.AckAccepted] > 1:
			o.Duplicated++
		case k[agentwire.AckAccepted] == 1 || k[agentwire.AckDuplicateAccepted] > 0:
			o.Accepted++
			done[a.String()] = true
		case k[agentwire.AckStaleRejected]+k[agentwire.AckInvalidRejected] > 0:
			o.Stale++
		}
	}
	o.Attempts = len(seen)
	return o, done
}

// describeAttempt says what the fleet saw of attempt a (a ULID string):
// executions and completion acks by kind.
// revokedAttempt reports whether the daemon took attempt a's lease back:
// it cancelled the attempt with LeaseRevoked, or answered its completion
// StaleRejected (the lease expired or was revoked: no completion is
// recorded).
func (f *Fleet) revokedAttempt(a string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, r := range f.cancels {
		if r == agentwire.CancelLeaseRevoked && id.String() == a {
			return true
		}
	}
	for id, k := range f.acks {
		if k != nil && k[agentwire.AckStaleRejected] > 0 && id.String() == a {
			return true
		}
	}
	return false
}

func (f *Fleet) describeAttempt(a string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, n := range f.runs {
		if id.String() == a {
			k := f.acks[id]
			if k == nil {
				k = &[4]int{}
			}
			c := ""
			if r, ok := f.cancels[id]; ok {
				c = fmt.Sprintf(", cancelled by the daemon: %v", r)
			}
			return fmt.Sprintf("(ran %d, acks accepted=%d duplicate=%d stale=%d invalid=%d%s)", n, k[0], k[1], k[2], k[3], c)
		}
	}
	return "(never ran here)"
}

// Warnings returns the agents' warnings by message.
func (f *Fleet) Warnings() map[string]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.warnings)
}

// Reasons returns failed attempts by reason.
func (f *Fleet) Reasons() map[string]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.reasons)
}

// PeakRegistrations is the highest number of registrations in one second
// (of the fleet's clock) between from and to.
func (f *Fleet) PeakRegistrations(from, to time.Time) int64 {
	var peak int64
	a, b := int(from.Sub(f.start)/time.Second), int(to.Sub(f.start)/time.Second)
	for s := max(a, 0); s <= b && s < maxSeconds; s++ {
		peak = max(peak, f.regs[s].Load())
	}
	return peak
}

// Attempts returns the connection attempts per agent (sorted).
func (f *Fleet) Attempts() []int64 {
	out := make([]int64, len(f.members))
	for i, m := range f.members {
		out[i] = m.attempts.Load()
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Drops counts disconnects of registered agents while no restart was under
// way.
func (f *Fleet) Drops() int64 { return f.drops.Load() }

// Close stops every agent (their Run returns) and waits up to timeout.
// closeTransports drops the fleet's reference to the shared QUIC sockets
// (each closes with its last connection).
func (f *Fleet) closeTransports() {
	for _, tr := range f.transports {
		_ = tr.Close()
	}
}

func (f *Fleet) Close(timeout time.Duration) error {
	f.cancel()
	defer f.closeTransports()
	var wg sync.WaitGroup
	for _, m := range f.members {
		wg.Go(func() { _ = m.a.Close() })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); f.wg.Wait(); close(done) }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return os.RemoveAll(f.o.SpoolDir)
	case <-t.C:
		return fmt.Errorf("loadgen: agents still running %v after Close", timeout)
	}
}
