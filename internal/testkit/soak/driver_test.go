package soak

import (
	"bytes"
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
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/webtransport"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/session"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// config is one soak run.
type config struct {
	seed     uint64
	n        int      // lifecycles in all, split over the backends
	backends []string // memory, quic, yamux, webtransport
	faults   bool
	inflight int // concurrent lifecycles per backend
	agents   int // agents per backend
}

// result is one backend's share of a run.
type result struct {
	backend    string
	lifecycles int
	elapsed    time.Duration
	faults     map[string]int64
	observed   map[string]int64
}

// tempDir is a fresh directory removed at the end of the test, under
// -soak.dir (default: /dev/shm when it exists, so the SQLite file, the
// agents' spools and the content store sit on tmpfs and the run measures
// the protocol rather than the shared disk's fsync latency; a daemon
// crash here is a process crash, for which fsync does not matter).
func tempDir(t *testing.T) string {
	base := *flagDir
	if base == "" {
		if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
			base = "/dev/shm"
		}
	}
	if base == "disk" || base == "" {
		return t.TempDir()
	}
	d, err := os.MkdirTemp(base, "forgeyard-soak-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// timing is the soak daemon's timing: fast renewals and heartbeats, and a
// lease TTL (60 s) far above the largest clock step (20 s: ±10 s offset),
// so no clock step may expire a lease.
func timing() daemon.Timing {
	return daemon.Timing{HeartbeatInterval: time.Second, RenewInterval: 200 * time.Millisecond,
		LeaseTTL: 60 * time.Second, RevokeGrace: 5 * time.Second, RegistrationTimeout: 5 * time.Second,
		RequestTimeout: time.Second, MaxBackoff: 100 * time.Millisecond}
}

// netBackend listens on a given address again after a crash.
type netBackend struct {
	name   string
	listen func(addr string, conf *tls.Config) (semantics.BackendListener, string, error)
	dialer func(conf *tls.Config) semantics.BackendDialer
}

func backendNamed(name string) (netBackend, error) {
	switch name {
	case "memory":
		n := memory.NewNetwork()
		return netBackend{name: name,
			listen: func(addr string, conf *tls.Config) (semantics.BackendListener, string, error) {
				if addr == "" {
					addr = "soak-daemon"
				}
				l, err := n.Listen(addr, conf)
				return l, addr, err
			},
			dialer: func(conf *tls.Config) semantics.BackendDialer { return &memory.Dialer{Network: n, TLSConfig: conf} }}, nil
	case "quic":
		return netBackend{name: name,
			listen: func(addr string, conf *tls.Config) (semantics.BackendListener, string, error) {
				l, err := quic.Listen(orAny(addr), conf, quic.Config{})
				if err != nil {
					return nil, "", err
				}
				return l, l.Addr().String(), nil
			},
			dialer: func(conf *tls.Config) semantics.BackendDialer { return quic.Dialer{TLS: conf} }}, nil
	case "yamux":
		return netBackend{name: name,
			listen: func(addr string, conf *tls.Config) (semantics.BackendListener, string, error) {
				l, err := yamux.Listen(orAny(addr), conf, yamux.Config{})
				if err != nil {
					return nil, "", err
				}
				return l, l.Addr().String(), nil
			},
			dialer: func(conf *tls.Config) semantics.BackendDialer { return yamux.Dialer{TLS: conf} }}, nil
	case "webtransport":
		return netBackend{name: name,
			listen: func(addr string, conf *tls.Config) (semantics.BackendListener, string, error) {
				l, err := webtransport.Listen(orAny(addr), conf, webtransport.Config{})
				if err != nil {
					return nil, "", err
				}
				return l, l.Addr().String(), nil
			},
			dialer: func(conf *tls.Config) semantics.BackendDialer { return webtransport.Dialer{TLS: conf} }}, nil
	}
	return netBackend{}, fmt.Errorf("soak: unknown backend %q (memory, quic, yamux, webtransport)", name)
}

func orAny(addr string) string {
	if addr == "" {
		return "127.0.0.1:0"
	}
	return addr
}

// trackListener records the connections it accepted, so a crash can cut
// them without a GoAway.
type trackListener struct {
	semantics.BackendListener
	mu    sync.Mutex
	conns []semantics.BackendConn
}

func (l *trackListener) Accept(ctx context.Context) (semantics.BackendConn, error) {
	c, err := l.BackendListener.Accept(ctx)
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *trackListener) cutAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		if m, ok := c.(*memory.Conn); ok {
			m.Disconnect()
		} else {
			_ = c.CloseWithCode(wire.CloseInternalError, "soak: daemon crash")
		}
	}
	l.conns = nil
}

// incarnation is one daemon process's lifetime.
type incarnation struct {
	gen    int
	d      *daemon.Daemon
	auth   authority.Authority // the SQLite handle (undecorated)
	l      *trackListener
	view   *sinkView
	cancel context.CancelFunc
	served chan struct{}
}

// life is one lifecycle's state.
type life struct {
	p       plan
	attempt wire.JobAttemptId
	runs    atomic.Int32
	written atomic.Int32 // stdout lines the executor wrote
	blocked chan struct{}
	once    sync.Once
	outRef  wire.CasObjectRef
	done    chan agent.AttemptDone
	// the daemons' completion answers for the attempt (every incarnation)
	accepted, dups, stale, invalid atomic.Int32
}

type soakAgent struct {
	id enginetest.Identity
	a  *agent.Agent
	rd *enginetest.RecDialer
}

// cluster is one backend's daemon (with its restarts), agents and stores.
type cluster struct {
	t      *testing.T
	cfg    config
	nb     netBackend
	pki    *trusttest.PKI
	dbPath string
	addr   string
	logs   *durableLogs
	store  *cas.FSStore
	clock  stepClock
	faults *authFaults
	cnt    *counters
	tr     sync.Map // wire.JobAttemptId → *life
	logBuf *enginetest.SyncBuffer
	world  *enginetest.World
	agents []*soakAgent
	fail   func(error)

	mu  sync.Mutex // serializes crashes; guards cur
	cur *incarnation
}

func newCluster(t *testing.T, cfg config, name string, fail func(error)) *cluster {
	nb, err := backendNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	dir := tempDir(t)
	store, err := cas.NewFSStore(cas.FSStoreConfig{Dir: filepath.Join(dir, "cas")})
	if err != nil {
		t.Fatal(err)
	}
	cnt := &counters{}
	c := &cluster{t: t, cfg: cfg, nb: nb, pki: trusttest.NewPKI(t), dbPath: filepath.Join(dir, "authority.db"), logs: newDurableLogs(),
		store: store, cnt: cnt, logBuf: &enginetest.SyncBuffer{}, fail: fail,
		faults: &authFaults{cnt: cnt, resend: min(timing().RenewInterval, timing().RequestTimeout)}}
	inc, err := c.start()
	if err != nil {
		t.Fatal(err)
	}
	c.cur = inc
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = c.cur.d.Shutdown(ctx)
		c.cur.cancel()
		<-c.cur.served
		_ = c.cur.auth.Close()
	})
	c.world = &enginetest.World{T: t, Pki: c.pki, Addr: c.addr, B: enginetest.Backend{Name: nb.name,
		Dialer: func(_ *testing.T, conf *tls.Config) semantics.BackendDialer { return nb.dialer(conf) }}}
	for i := 0; i < cfg.agents; i++ {
		id := c.world.NewIdentity()
		a, rd, _ := c.world.StartAgent(id, agent.ExecutorFunc(c.execute), enginetest.SpoolIn(tempDir(t)), func(ac *agent.Config) {
			ac.RequestTimeout = time.Second
			ac.Logger = slog.New(slog.NewTextHandler(c.logBuf, &slog.HandlerOptions{Level: slog.LevelWarn})).With("agent", i)
			ac.Hooks.OnAttemptDone = c.attemptDone
		})
		c.agents = append(c.agents, &soakAgent{id: id, a: a, rd: rd})
	}
	for _, ag := range c.agents {
		if err := c.awaitActive(context.Background(), ag.id.Runner); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// start opens the authority and starts a daemon incarnation on c.addr
// (any address the first time).
func (c *cluster) start() (*incarnation, error) {
	gen := 1
	if c.cur != nil {
		gen = c.cur.gen + 1
	}
	raw, err := authority.OpenSQLite(context.Background(), c.dbPath)
	if err != nil {
		return nil, err
	}
	view := c.logs.view()
	d, err := daemon.New(daemon.Config{ID: "soak-" + c.nb.name, Authority: &faultAuth{Authority: raw, f: c.faults},
		RunnerCAs: c.pki.CAPool(), Timing: timing(), Features: wire.Implemented, Now: c.clock.Now,
		LogSink: view, ContentStore: c.store, Hooks: daemon.Hooks{OnCompletion: c.onCompletion},
		Logger: slog.New(slog.NewTextHandler(c.logBuf, &slog.HandlerOptions{Level: slog.LevelWarn})).With("incarnation", gen)})
	if err != nil {
		_ = raw.Close()
		return nil, err
	}
	// The address of a crashed incarnation is free again at once (memory,
	// UDP) or after the listener's close completes; retry briefly.
	var l semantics.BackendListener
	var addr string
	for try := 0; ; try++ {
		l, addr, err = c.nb.listen(c.addr, c.pki.ServerConfig(c.t, "localhost"))
		if err == nil {
			break
		}
		if try == 100 {
			_ = raw.Close()
			return nil, fmt.Errorf("listen again on %s: %w", c.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.addr = addr
	tl := &trackListener{BackendListener: l}
	ctx, cancel := context.WithCancel(context.Background())
	inc := &incarnation{gen: gen, d: d, auth: raw, l: tl, view: view, cancel: cancel, served: make(chan struct{})}
	go func() {
		defer close(inc.served)
		_ = d.Serve(ctx, tl)
	}()
	return inc, nil
}

func (c *cluster) current() *incarnation {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// crash ends the current incarnation as a process crash would — its
// connections cut without GoAway, its unsynced log records and its
// authority handle gone — and starts a new one on the same address and
// SQLite file.
func (c *cluster) crash() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.cur
	_ = old.l.Close()
	old.l.cutAll()
	c.logs.crash(old.view)
	_ = old.auth.Close()
	old.cancel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = old.d.Shutdown(ctx) // stops its loops; it has no connection left to say GoAway to
	select {
	case <-old.served:
	case <-time.After(10 * time.Second):
		return errors.New("crashed daemon's Serve did not return")
	}
	inc, err := c.start()
	if err != nil {
		return err
	}
	c.cur = inc
	c.cnt.add(fCrash, 1)
	return nil
}

func (c *cluster) awaitActive(ctx context.Context, runner wire.RunnerId) error {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		for _, s := range c.current().d.Sessions() {
			if s.Runner == runner && s.State == session.Active.String() {
				return nil
			}
		}
		time.Sleep(2 * time.Millisecond) // no event marks the end of a resync
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("runner %s not active on the daemon after 20 s", runner)
}

func (c *cluster) life(a wire.JobAttemptId) *life {
	if v, ok := c.tr.Load(a); ok {
		return v.(*life)
	}
	return nil
}

func (c *cluster) onCompletion(ev daemon.CompletionEvent) {
	lf := c.life(ev.Attempt)
	if lf == nil {
		c.fail(fmt.Errorf("daemon recorded a completion of unknown attempt %s", ev.Attempt))
		return
	}
	switch ev.Ack {
	case agentwire.AckAccepted:
		lf.accepted.Add(1)
	case agentwire.AckDuplicateAccepted:
		lf.dups.Add(1)
	case agentwire.AckStaleRejected:
		lf.stale.Add(1)
	default:
		lf.invalid.Add(1)
	}
}

func (c *cluster) attemptDone(d agent.AttemptDone) {
	lf := c.life(d.Job.Attempt)
	if lf == nil {
		c.fail(fmt.Errorf("agent finished unknown attempt %s", d.Job.Attempt))
		return
	}
	select {
	case lf.done <- d:
	default:
		c.fail(fmt.Errorf("lifecycle %d: attempt %s finished more than %d times", lf.p.Index, lf.attempt, cap(lf.done)))
	}
}

// execute is the agents' executor: it writes the plan's stdout lines
// (half of them, then waits for the cancel, when the plan cancels) and
// stores the plan's output.
func (c *cluster) execute(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
	lf := c.life(job.Attempt)
	if lf == nil {
		c.fail(fmt.Errorf("agent ran unknown attempt %s", job.Attempt))
		return agent.Result{Kind: agentwire.ResultFailed, ExitCode: 99}
	}
	if lf.runs.Add(1) > 1 {
		c.fail(fmt.Errorf("lifecycle %d: attempt %s executed twice", lf.p.Index, lf.attempt))
	}
	p := lf.p
	out.Phase(agentwire.PhaseRunning)
	n := p.Lines
	if p.Cancel {
		n = max(1, p.Lines/2)
	}
	for i := 0; i < n; i++ {
		if err := out.Log(wlogs.LogStdout, []byte(line(c.cfg.seed, p.Index, i))); err != nil {
			return agent.Result{Kind: agentwire.ResultInfraError, Message: err.Error()}
		}
		lf.written.Add(1)
	}
	if p.Cancel {
		lf.once.Do(func() { close(lf.blocked) })
		select {
		case <-ctx.Done():
			return agent.Result{Kind: agentwire.ResultCancelled}
		case <-time.After(60 * time.Second):
			return agent.Result{Kind: agentwire.ResultFailed, ExitCode: 98, Message: "soak: the cancel never arrived"}
		}
	}
	t := time.NewTimer(p.Run)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
		return agent.Result{Kind: agentwire.ResultCancelled}
	}
	ref, err := out.PutOutput(outputOf(c.cfg.seed, p.Index, p.OutSize))
	if err != nil {
		return agent.Result{Kind: agentwire.ResultInfraError, Message: err.Error()}
	}
	lf.outRef = ref
	return agent.Result{Kind: agentwire.ResultSucceeded}
}

// retryable reports errors a host retries an offer or cancel after: the
// runner is between connections, the daemon crashed under the call, or
// the authority hiccuped.
func retryable(err error) bool {
	return errors.Is(err, daemon.ErrNotConnected) || errors.Is(err, daemon.ErrShutdown) || errors.Is(err, errInjected) ||
		errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "database is closed") ||
		strings.Contains(err.Error(), "sql: ") || strings.Contains(err.Error(), "closed")
}

// offer offers lf's attempt until it is recorded (OfferLease answered, or
// the lease created in the authority: after a crash the next incarnation
// re-sends it on the agent's resync).
func (c *cluster) offer(ctx context.Context, ag *soakAgent, lf *life) error {
	o := daemon.LeaseOffer{Job: wire.NewJobId(), Attempt: lf.attempt, Spec: enginetest.Spec(lf.p.Index),
		Payload: wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: wire.Digest{1, byte(lf.p.Index)}, Size: 10}}
	var last error
	for try := 0; try < 100; try++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		octx, cancel := context.WithTimeout(ctx, 20*time.Second)
		_, err := c.current().d.OfferLease(octx, ag.id.Runner, o)
		cancel()
		if err == nil {
			return nil
		}
		if _, ok := c.faults.created.Load(lf.attempt); ok {
			if errors.Is(err, daemon.ErrShutdown) || errors.Is(err, errInjected) || strings.Contains(err.Error(), "closed") ||
				(errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil) {
				// Recorded: the daemon keeps re-sending the offer (a
				// restarted one after the resync) and the answer reaches
				// the authority; the completion wait below bounds it.
				return nil
			}
			return fmt.Errorf("offer recorded, then %w", err)
		}
		if !retryable(err) {
			return fmt.Errorf("offer: %w", err)
		}
		last = err
		if err := c.awaitActive(ctx, ag.id.Runner); err != nil {
			return err
		}
	}
	return fmt.Errorf("offer not recorded after 100 tries: %w", last)
}

// cancel cancels lf's attempt copies times at once, each retried through
// crashes and authority errors until the daemon takes it.
func (c *cluster) cancel(ctx context.Context, lf *life, copies int) error {
	errs := make(chan error, copies)
	for k := 0; k < copies; k++ {
		go func() {
			var err error
			for try := 0; try < 200; try++ {
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err = c.current().d.CancelAttempt(cctx, lf.attempt, agentwire.CancelUserRequested)
				cancel()
				if err == nil || ctx.Err() != nil || !retryable(err) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			errs <- err
		}()
	}
	var first error
	for k := 0; k < copies; k++ {
		if err := <-errs; err != nil && first == nil {
			first = fmt.Errorf("CancelAttempt: %w", err)
		}
	}
	return first
}

// lifecycle runs one lease lifecycle with its plan's faults and checks it.
func (c *cluster) lifecycle(ctx context.Context, p plan) error {
	ag := c.agents[p.Index%len(c.agents)]
	lf := &life{p: p, attempt: wire.NewJobAttemptId(), blocked: make(chan struct{}), done: make(chan agent.AttemptDone, 2)}
	c.tr.Store(lf.attempt, lf)
	c.faults.arm(lf.attempt, p)
	if p.Cancel {
		c.cnt.add(fCancel, 1)
	}
	if p.Cut {
		tm := time.AfterFunc(p.CutAfter, func() {
			if ag.rd.Cut() {
				c.cnt.add(fCut, 1)
			}
		})
		defer tm.Stop()
	}
	early := make(chan error, 1)
	if p.Cancel && p.CancelEarly {
		go func() {
			// As soon as the lease exists: the cancel races the offer and
			// its acceptance (reordered delivery, §73/§175).
			deadline := time.Now().Add(20 * time.Second)
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if _, ok := c.faults.created.Load(lf.attempt); ok {
					c.cnt.add(fEarlyCancel, 1)
					early <- c.cancel(ctx, lf, p.CancelCopies)
					return
				}
				time.Sleep(200 * time.Microsecond)
			}
			early <- errors.New("lease never recorded for the early cancel")
		}()
	}
	if err := c.offer(ctx, ag, lf); err != nil {
		return err
	}
	if p.Crash {
		if err := c.crash(); err != nil {
			return err
		}
	}
	if p.ClockStep != 0 {
		c.clock.step(p.ClockStep)
		c.cnt.add(fClockStep, 1)
	}
	if p.Cancel {
		if p.CancelEarly {
			if err := <-early; err != nil {
				return err
			}
		} else {
			select {
			case <-lf.blocked:
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(30 * time.Second):
				return errors.New("the attempt to cancel never started")
			}
			if err := c.cancel(ctx, lf, p.CancelCopies); err != nil {
				return err
			}
		}
		if p.CancelCopies > 1 {
			c.cnt.add(fDupCancel, int64(p.CancelCopies-1))
		}
	}
	var d agent.AttemptDone
	select {
	case d = <-lf.done:
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(60 * time.Second):
		return fmt.Errorf("attempt %s not acknowledged within 60 s (runs %d, lines %d)", lf.attempt, lf.runs.Load(), lf.written.Load())
	}
	if p.Cancel && p.CancelCopies > 1 {
		// One more copy after the end: harmless (§73), no second completion.
		if err := c.cancel(ctx, lf, 1); err != nil {
			return fmt.Errorf("cancel after the end: %w", err)
		}
		c.cnt.add(fDupCancel, 1)
	}
	if err := c.check(ctx, lf, d); err != nil {
		return fmt.Errorf("attempt %s (acknowledged %s after %d completion re-sends): %w\nwarnings naming it:\n%s", lf.attempt, d.Ack, d.Retries, err, c.grep(lf.attempt.String()))
	}
	return nil
}

// grep returns the warnings that mention s.
func (c *cluster) grep(s string) string {
	var out []string
	for _, l := range strings.Split(c.logBuf.String(), "\n") {
		if strings.Contains(l, s) {
			out = append(out, "  "+l)
		}
	}
	return strings.Join(out, "\n")
}

// check is the per-lifecycle invariant: acknowledged once with the
// expected result, executed once, one completion in the authority, the log
// complete and in order, the output stored with its digest.
func (c *cluster) check(ctx context.Context, lf *life, d agent.AttemptDone) error {
	want := agentwire.ResultSucceeded
	if lf.p.Cancel {
		want = agentwire.ResultCancelled
	}
	if d.Result.Kind != want {
		return fmt.Errorf("result %s (%s), want %s", d.Result.Kind, d.Result.Message, want)
	}
	if d.Ack != agentwire.AckAccepted && d.Ack != agentwire.AckDuplicateAccepted {
		return fmt.Errorf("completion acknowledged %s", d.Ack)
	}
	if n := lf.runs.Load(); n != 1 {
		return fmt.Errorf("executed %d times", n)
	}
	var n int
	var err error
	for try := 0; try < 100; try++ { // a crash may close the handle under the read
		if n, err = c.current().auth.Completions(ctx, lf.attempt); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil || n != 1 {
		return fmt.Errorf("authority holds %d completions (%v), want 1", n, err)
	}
	if a := lf.accepted.Load(); a > 1 || a+lf.dups.Load() < 1 {
		return fmt.Errorf("daemons answered the completion Accepted %d times, DuplicateAccepted %d times", a, lf.dups.Load())
	}
	if s, i := lf.stale.Load(), lf.invalid.Load(); s+i > 0 {
		return fmt.Errorf("completion answered StaleRejected %d, InvalidRejected %d times", s, i)
	}
	recs := c.logs.records(lf.attempt)
	var stdout strings.Builder
	for i, r := range recs {
		if r.Seq != uint64(i+1) {
			return fmt.Errorf("log record %d has seq %d (gap or duplicate)", i, r.Seq)
		}
		if r.Kind == wlogs.LogStdout {
			stdout.Write(r.Data)
		}
	}
	var wantLog strings.Builder
	for i := 0; i < int(lf.written.Load()); i++ {
		wantLog.WriteString(line(c.cfg.seed, lf.p.Index, i))
	}
	if stdout.String() != wantLog.String() {
		return fmt.Errorf("durable log holds %d stdout bytes in %d records, the executor wrote %d bytes in %d lines:\n got %q\nwant %q",
			stdout.Len(), len(recs), wantLog.Len(), lf.written.Load(), clip(stdout.String()), clip(wantLog.String()))
	}
	if want == agentwire.ResultSucceeded {
		blob := outputOf(c.cfg.seed, lf.p.Index, lf.p.OutSize)
		ref := wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: sha256.Sum256(blob), Size: uint64(len(blob))}
		if lf.outRef != ref {
			return fmt.Errorf("PutOutput returned %v, want %v", lf.outRef, ref)
		}
		st, err := c.store.Stat(ref)
		if err != nil || !st.Complete {
			fin, ok := c.current().d.FinalizedOutputs(lf.attempt)
			return fmt.Errorf("output %v not in the content store: %+v %v; the completion claims %v; finalized outputs %v %v",
				ref, st, err, d.Result.Outputs, fin, ok)
		}
		if !slices.Contains(d.Result.Outputs, ref) {
			return fmt.Errorf("output %v stored but not claimed by the completion (claims %v)", ref, d.Result.Outputs)
		}
		rc, err := c.store.Open(ref, 0)
		if err != nil {
			return fmt.Errorf("open output: %w", err)
		}
		got, err := io.ReadAll(rc)
		_ = rc.Close()
		if err != nil || sha256.Sum256(got) != ref.Digest || !bytes.Equal(got, blob) {
			return fmt.Errorf("stored output differs (%d bytes, %v)", len(got), err)
		}
	}
	return nil
}

func clip(s string) string {
	if len(s) > 300 {
		return s[:150] + " … " + s[len(s)-150:]
	}
	return s
}

// run runs plans (this backend's share) with cfg.inflight workers. It
// returns the first failure, naming the lifecycle and its plan.
func (c *cluster) run(ctx context.Context, plans []plan) (result, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, c.cfg.inflight)
	start := time.Now()
	for w := 0; w < c.cfg.inflight; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(plans) || ctx.Err() != nil {
					return
				}
				if err := c.lifecycle(ctx, plans[i]); err != nil {
					if ctx.Err() == nil {
						errs <- fmt.Errorf("%s lifecycle %s: %w", c.nb.name, plans[i], err)
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	res := result{backend: c.nb.name, lifecycles: len(plans), elapsed: time.Since(start), faults: c.cnt.snapshot(), observed: map[string]int64{}}
	for _, ag := range c.agents {
		st := ag.a.Stats()
		res.observed["agent_reconnects"] += st.Reconnects
		res.observed[fDupCompletionObs] += st.CompletionsRetried
		res.observed["duplicate_offers_absorbed"] += st.DuplicatesAbsorbed
	}
	st := c.current().d.Stats() // the last incarnation's
	res.observed["offer_resends(last incarnation)"] = st.OfferResends
	select {
	case err := <-errs:
		return res, err
	default:
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return res, fmt.Errorf("%s: %d lifecycles not done within -soak.timeout", c.nb.name, len(plans))
	}
	return res, nil // cancelled: another backend failed
}

// logTail is the last lines of the daemons' and agents' warnings, for a failure.
func (c *cluster) logTail(n int) string {
	lines := strings.Split(strings.TrimSpace(c.logBuf.String()), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
