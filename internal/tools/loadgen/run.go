package loadgen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"forgeyard.dev/transport/internal/stats"
	"forgeyard.dev/transport/semantics/agent"
)

// Options are one load-generation run.
type Options struct {
	Backend string // "quic", "yamux" or "webtransport"
	N       int
	// Ramp spreads the starts over this long (0: all at once).
	Ramp time.Duration
	// Curves restricts the key exchange on both sides, raw herd included
	// (e.g. ["x25519"]; empty: Go's default hybrid).
	Curves []string
	// Heartbeat is the interval written into the daemon's configuration
	// (the daemon sets it for its agents); 0 keeps the daemon's default.
	Heartbeat time.Duration
	// Steady is the measuring window once every agent registered (memory,
	// CPU, heartbeat RTT, leases).
	Steady time.Duration
	// LeaseRate is offers per second across the fleet (0: none).
	LeaseRate float64
	// KillRestart: SIGKILL the daemon after the steady window and start it
	// again at once; GracefulRestart: SIGTERM (GoAway), then start it
	// again. Both need a daemon started by the loadgen.
	KillRestart, GracefulRestart bool
	// RedialHold, with a restart: the fleet's dials wait from the stop
	// until RedialHold after the restarted daemon is ready, so that the
	// agents' notice of the restart is measured apart from their
	// reconnection storm (the one-process fleet re-handshaking on the
	// same cores as the notices it is still to hear). Its "all back"
	// figure then includes the hold.
	RedialHold time.Duration
	// SessionResumption: the fleet's agents resume their TLS sessions
	// (FleetOptions.SessionResumption).
	SessionResumption bool
	// Raw measures the raw baseline of Backend with N connections after
	// the fleet stopped: raw quic-go, hashicorp/yamux over TLS, or
	// webtransport-go (each backend's own library).
	Raw bool
	// Timeout bounds the whole run; on expiry the run stops where it is
	// and the summary says so (TimedOut).
	Timeout time.Duration
	// Dir is the work directory (dev PKI, runner cache, authority, logs).
	Dir string
	// DaemonBin starts the daemon (forgeyard-daemon) when set; otherwise
	// Attach describes a running one.
	DaemonBin  string
	DaemonArgs []string
	Attach     *Daemon
	// SourceAddrs spreads agents over 127.0.0.1 … 127.0.0.<n> (TCP agents
	// bind the address, QUIC agents share one socket per address).
	SourceAddrs int
	Exec        agent.SyntheticOptions
	// RequestTimeout is each agent's request deadline (0: the agent's
	// default, 10 s).
	RequestTimeout time.Duration
	// Progress gets one line a second (nil: none).
	Progress io.Writer
	// ShutdownTimeout is the daemon's --shutdown-timeout (0: 10 s).
	ShutdownTimeout time.Duration
	// Profile, with a daemon the loadgen starts, records the daemon's CPU
	// profile over the first Profile (at most 25 s) of the cold start in
	// Dir/herd-cpu.pprof, over the steady window (at most 25 s; it starts
	// once the herd's profile is written) in Dir/steady-cpu.pprof and its
	// heap after the steady window in Dir/steady-heap.pprof (read them with
	// `go tool pprof`); 0: none.
	Profile time.Duration
}

// runner is the state the phases of Run share.
type runner struct {
	o Options
	s *Summary
	p *PKI
	d *Daemon
	// base is the daemon's process before the fleet started.
	base ProcStats

	prof               *profiling
	herdProf, selfProf <-chan error
	// herdErr is the herd profile's outcome once steady waited for it (the
	// daemon records one CPU profile at a time); steadyProf the steady
	// window's profile.
	herdErr    error
	herdWaited bool
	steadyProf <-chan error

	f          *Fleet
	hz         *healthPoller
	stopHz     context.CancelFunc
	leases     *Leases
	stopLeases context.CancelFunc
	leasesDone chan struct{}
}

// Run runs one scenario and returns its summary. An error means the run
// could not start (or the daemon could not be restarted); a run that
// started always yields a summary, whose Violations say what failed.
func Run(ctx context.Context, o Options) (*Summary, error) {
	if o.Timeout <= 0 {
		o.Timeout = 15 * time.Minute
	}
	if (o.KillRestart || o.GracefulRestart) && o.DaemonBin == "" {
		return nil, errors.New("loadgen: --kill-restart and --graceful-restart need the loadgen to start the daemon (--spawn-daemon)")
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	s := &Summary{Backend: o.Backend, N: o.N, Ramp: o.Ramp, SteadyFor: o.Steady, LeaseRate: o.LeaseRate, Started: time.Now().UTC(),
		HeartbeatInterval: o.Heartbeat, Failed: map[string]int64{}}
	r := &runner{o: o, s: s, d: o.Attach}
	if err := r.preparePKI(); err != nil {
		return nil, err
	}
	if err := r.spawnDaemon(ctx); err != nil {
		return nil, err
	}
	if o.DaemonBin != "" {
		defer func() { _ = r.d.Close() }()
	}
	if err := r.measureIdle(ctx); err != nil {
		return nil, err
	}
	if err := r.buildFleet(ctx); err != nil {
		return nil, err
	}
	defer r.stopHz()
	cm := r.startFleet(ctx)
	defer func() { r.stopLeases(); <-r.leasesDone }()

	// Cold start.
	r.coldStart(ctx, cm)

	// Steady window.
	r.steady(ctx)
	r.measureSteady(ctx)

	// Restarts.
	if err := r.restarts(ctx); err != nil {
		return s, err
	}

	// Drain: no new offers; every accepted lease must complete.
	r.drain(ctx)
	r.closeFleet(ctx)

	if o.Raw && !s.TimedOut {
		r.rawBaseline(ctx)
	}
	s.check()
	s.Took = time.Since(s.Started)
	return s, nil
}

// preparePKI is the first phase: the work directory and the fleet's dev
// PKI.
func (r *runner) preparePKI() error {
	o, s := r.o, r.s
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return err
	}
	p, err := PreparePKI(filepath.Join(o.Dir, "pki"), o.N)
	if err != nil {
		return err
	}
	if err := p.SetCurves(o.Curves); err != nil {
		return err
	}
	s.CertsGenerated, s.CertsTook = p.Generated, p.Took
	r.p = p
	return nil
}

// spawnDaemon is the daemon phase, when the loadgen starts the daemon: its
// configuration, a fresh authority, the profiling flags and the process.
// On success r.d is the started daemon (the caller closes it).
func (r *runner) spawnDaemon(ctx context.Context) error {
	o, p := r.o, r.p
	if o.DaemonBin == "" {
		return nil
	}
	addrs := map[string]string{o.Backend: "127.0.0.1:0"}
	if _, err := WriteDaemonConfig(o.Dir, p, o.Heartbeat, addrs); err != nil {
		return err
	}
	// A fresh authority per run: the fleet's runners are new to it.
	for _, f := range []string{"authority.db", "authority.db-wal", "authority.db-shm"} {
		_ = os.Remove(filepath.Join(o.Dir, f))
	}
	args := o.DaemonArgs
	if o.Profile > 0 {
		var pargs []string
		var err error
		if r.prof, pargs, err = newProfiling(o.Dir); err != nil {
			return err
		}
		args = append(append([]string(nil), args...), pargs...)
	}
	d, err := StartDaemon(ctx, DaemonOptions{Bin: o.DaemonBin, Dir: o.Dir, Backends: []string{o.Backend}, Args: args,
		ShutdownTimeout: o.ShutdownTimeout})
	if err != nil {
		return err
	}
	r.d = d
	return nil
}

// measureIdle checks that the daemon has an address for the backend and
// records its idle memory.
func (r *runner) measureIdle(ctx context.Context) error {
	o, s, d := r.o, r.s, r.d
	if d == nil || d.Addr(o.Backend) == "" {
		return fmt.Errorf("loadgen: no daemon address for %s", o.Backend)
	}
	r.base, _ = d.Proc()
	s.Daemon.RSSIdle = r.base.RSS
	r.prof.collect(ctx)
	idle := goStatsOf(ctx, d)
	s.Daemon.HeapIdle, s.Daemon.GoroutinesIdle, s.Daemon.StackIdle = idle.heap, idle.goroutines, idle.stack
	return nil
}

// buildFleet is the fleet phase: the fleet of agents (not started yet) and
// the daemon's health poller (r.stopHz stops it).
func (r *runner) buildFleet(ctx context.Context) error {
	o, d := r.o, r.d
	f, err := NewFleet(FleetOptions{Backend: o.Backend, Addr: d.Addr(o.Backend), PKI: r.p, Ramp: o.Ramp, SourceAddrs: o.SourceAddrs,
		SpoolDir: filepath.Join(o.Dir, "spool"), Exec: o.Exec, RequestTimeout: o.RequestTimeout, Progress: o.Progress,
		SessionResumption: o.SessionResumption})
	if err != nil {
		return err
	}
	r.f = f
	r.hz = newHealthPoller(d)
	hzCtx, stopHz := context.WithCancel(ctx)
	r.stopHz = stopHz
	go r.hz.run(hzCtx)
	return nil
}

// coldMarks are the counters read just before the fleet started, and the
// cold-start round.
type coldMarks struct {
	hb0          Histogram
	dcpu0, lcpu0 float64
	cold         *Round
}

// startFleet starts the cold start: the CPU profiles, the fleet and the
// lease offers (r.stopLeases stops them, r.leasesDone is closed when they
// stopped).
func (r *runner) startFleet(ctx context.Context) coldMarks {
	o, d, f := r.o, r.d, r.f
	hb0 := f.HeartbeatHistogram()
	if r.prof != nil {
		r.herdProf = r.prof.cpu(ctx, o.Profile, filepath.Join(o.Dir, "herd-cpu.pprof"))
		r.selfProf = profileSelf(ctx, o.Profile, filepath.Join(o.Dir, "herd-loadgen-cpu.pprof"))
	}
	dcpu0, lcpu0 := procCPU(d), selfCPU()
	cold := f.Start()
	leaseCtx, stopLeases := context.WithCancel(ctx)
	r.stopLeases = stopLeases
	r.leases = NewLeases(d, f, LeaseOptions{Rate: o.LeaseRate})
	r.leasesDone = make(chan struct{})
	go func() { defer close(r.leasesDone); r.leases.Run(leaseCtx) }()
	return coldMarks{hb0: hb0, dcpu0: dcpu0, lcpu0: lcpu0, cold: cold}
}

// coldStart waits for the cold-start round and records it.
func (r *runner) coldStart(ctx context.Context, cm coldMarks) {
	o, s, d, f := r.o, r.s, r.d, r.f
	s.Cold = s.waitRound(ctx, f, cm.cold)
	if dcpu1, lcpu1 := procCPU(d), selfCPU(); cm.dcpu0 >= 0 && dcpu1 >= 0 && cm.lcpu0 >= 0 && lcpu1 >= 0 {
		s.Cold.DaemonCPU, s.Cold.LoadgenCPU = dcpu1-cm.dcpu0, lcpu1-cm.lcpu0
	}
	r.hz.setPhase("steady")
	storm := f.HeartbeatHistogram().Sub(cm.hb0)
	s.Cold.HeartbeatP99 = storm.Quantile(0.99)
	s.Cold.AttemptsPerAgent = attemptStats(f.Attempts())
	s.Cold.Failed, s.Cold.FailedByReason = f.failed.Load(), f.Reasons()
	s.Handshakes = handshakesOf(ctx, d, o.Backend)
}

// steady is the steady window: heartbeats and the daemon's CPU over it.
func (r *runner) steady(ctx context.Context) {
	o, s, d, f := r.o, r.s, r.d, r.f
	if ctx.Err() == nil && o.Steady > 0 {
		if r.herdProf != nil {
			r.herdErr, r.herdWaited = <-r.herdProf, true
			r.steadyProf = r.prof.cpu(ctx, o.Steady, filepath.Join(o.Dir, "steady-cpu.pprof"))
		}
		hb1, cpu1 := f.HeartbeatHistogram(), procCPU(d)
		t := time.NewTimer(o.Steady)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		steady := f.HeartbeatHistogram().Sub(hb1)
		s.Steady.HeartbeatP50, s.Steady.HeartbeatP99, s.Steady.Heartbeats = steady.Quantile(0.5), steady.Quantile(0.99), int64(steady.Count)
		if steady.Count > 0 {
			// The interval the daemon set, as the fleet lives it.
			s.Steady.ObservedInterval = time.Duration(float64(o.Steady) * float64(o.N) / float64(steady.Count))
		}
		if cpu2 := procCPU(d); cpu1 >= 0 && cpu2 >= 0 {
			s.Daemon.CPUSecondsSteady = cpu2 - cpu1
			s.Daemon.CPUPercentPer1000 = (cpu2 - cpu1) / o.Steady.Seconds() * 100 / (float64(o.N) / 1000)
		}
	}
}

// measureSteady records the daemon's process and heap after the steady
// window, the profiles, and the health-check latencies.
func (r *runner) measureSteady(ctx context.Context) {
	o, s, d := r.o, r.s, r.d
	if ps, err := d.Proc(); err == nil {
		s.Daemon.RSS, s.Daemon.HWM, s.Daemon.CPUSeconds, s.Daemon.FDs, s.Daemon.Threads = ps.RSS, ps.HWM, ps.CPUSeconds, ps.FDs, ps.Threads
		s.Daemon.RSSPerAgent = float64(ps.RSS-r.base.RSS) / float64(o.N)
	}
	r.prof.collect(ctx) // the heap figure is then the live heap
	if g := goStatsOf(ctx, d); g.heap > 0 {
		s.Daemon.Heap, s.Daemon.Goroutines, s.Daemon.Stack, s.Daemon.HeapUnreturned = g.heap, g.goroutines, g.stack, g.unreturned
		s.Daemon.HeapPerAgent = float64(g.heap-s.Daemon.HeapIdle) / float64(o.N)
		s.Daemon.GoroutinesPerAgent = float64(g.goroutines-s.Daemon.GoroutinesIdle) / float64(o.N)
		s.Daemon.StackPerAgent = float64(g.stack-s.Daemon.StackIdle) / float64(o.N)
	}
	if r.herdProf != nil {
		r.collectProfiles(ctx)
	}
	s.Steady.HealthzP50, s.Steady.HealthzP99 = r.hz.percentiles("steady")
	s.Cold.HealthzP50, s.Cold.HealthzP99 = r.hz.percentiles("herd")
}

// collectProfiles waits for the cold start's CPU profiles and fetches the
// daemon's heap profile.
func (r *runner) collectProfiles(ctx context.Context) {
	o, s := r.o, r.s
	if !r.herdWaited {
		r.herdErr = <-r.herdProf
	}
	if r.herdErr != nil {
		s.Violations = append(s.Violations, fmt.Sprintf("herd CPU profile: %v", r.herdErr))
	} else {
		s.Profiles = append(s.Profiles, filepath.Join(o.Dir, "herd-cpu.pprof"))
	}
	if r.steadyProf != nil {
		if err := <-r.steadyProf; err != nil {
			s.Violations = append(s.Violations, fmt.Sprintf("steady CPU profile: %v", err))
		} else {
			s.Profiles = append(s.Profiles, filepath.Join(o.Dir, "steady-cpu.pprof"))
		}
	}
	if err := <-r.selfProf; err != nil {
		s.Violations = append(s.Violations, fmt.Sprintf("loadgen CPU profile: %v", err))
	} else {
		s.Profiles = append(s.Profiles, filepath.Join(o.Dir, "herd-loadgen-cpu.pprof"))
	}
	if err := r.prof.fetch(ctx, "heap", filepath.Join(o.Dir, "steady-heap.pprof")); err != nil {
		s.Violations = append(s.Violations, fmt.Sprintf("heap profile: %v", err))
	} else {
		s.Profiles = append(s.Profiles, filepath.Join(o.Dir, "steady-heap.pprof"))
	}
}

// restarts is the restart phase: a kill-restart and a graceful restart of
// the daemon, as asked. On an error the fleet is closed.
func (r *runner) restarts(ctx context.Context) error {
	o, d, f := r.o, r.d, r.f
	if o.KillRestart {
		if err := r.restart(ctx, "kill-restart", d.Kill); err != nil {
			_ = f.Close(30 * time.Second)
			return err
		}
	}
	if o.GracefulRestart {
		if err := r.restart(ctx, "graceful-restart", func() error { return d.Terminate(o.ShutdownTimeout + 10*time.Second) }); err != nil {
			_ = f.Close(30 * time.Second)
			return err
		}
	}
	return nil
}

// restart is one restart: the daemon stopped by stop and started again,
// and the fleet's round back to it recorded.
func (r *runner) restart(ctx context.Context, kind string, stop func() error) error {
	o, s, d, f := r.o, r.s, r.d, r.f
	if ctx.Err() != nil {
		return nil
	}
	before, failedBefore := f.attempts.Load(), f.failed.Load()
	stBefore := f.AgentStats()
	rd := f.BeginRound(kind)
	if o.RedialHold > 0 {
		f.gate.hold()
	}
	if err := stop(); err != nil {
		s.Violations = append(s.Violations, fmt.Sprintf("%s: stopping the daemon: %v", kind, err))
	}
	if err := d.Restart(ctx); err != nil {
		f.gate.release()
		return fmt.Errorf("loadgen: %s: %w", kind, err)
	}
	ready := time.Since(rd.Start)
	if o.RedialHold > 0 {
		time.AfterFunc(o.RedialHold, f.gate.release)
	}
	rr := RestartResult{Kind: kind, Round: s.waitRound(ctx, f, rd), Ready: ready}
	notice := rd.Notice()
	rr.Noticed = len(notice)
	rr.NoticeP50, rr.NoticeMax = stats.Percentile(notice, 50), stats.Percentile(notice, 100)
	rr.NoticeP50AfterReady, rr.NoticeMaxAfterReady = max(0, rr.NoticeP50-ready), max(0, rr.NoticeMax-ready)
	rr.Round.AttemptsPerAgentMean = float64(f.attempts.Load()-before) / float64(o.N)
	rr.Round.Failed = f.failed.Load() - failedBefore
	st := f.AgentStats()
	rr.TokenEnds = st.RestartTokenEnds - stBefore.RestartTokenEnds
	rr.HintProbes = st.RestartHints - stBefore.RestartHints
	rr.HintTimeouts = st.RestartHintTimeouts - stBefore.RestartHintTimeouts
	s.Restarts = append(s.Restarts, rr)
	return nil
}

// drain is the drain phase: the lease offers stopped, then every accepted
// lease waited for until it completes (or the drain budget ends).
func (r *runner) drain(ctx context.Context) {
	o, s, f := r.o, r.s, r.f
	r.stopLeases()
	<-r.leasesDone
	accepted := r.leases.Accepted()
	// An agent may take 4 request timeouts for the logs-finalized barrier
	// and as long for its uploads before it sends a completion
	// (agent.finishData): lost means not recorded within that budget.
	reqTimeout := o.RequestTimeout
	if reqTimeout <= 0 {
		reqTimeout = agent.DefaultRequestTimeout
	}
	drainDeadline := time.Now().Add(8*reqTimeout + 10*time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	var out Outcome
	var done map[string]bool
	for {
		out, done = f.Outcomes()
		lost, revoked := 0, 0
		for a := range accepted {
			switch {
			case done[a]:
			case f.revokedAttempt(a):
				revoked++
			default:
				lost++
			}
		}
		s.Completions = CompletionStats{Accepted: out.Accepted, Duplicated: out.Duplicated, Lost: lost, Revoked: revoked, DupAcks: out.DupAcks, Stale: out.Stale}
		if lost == 0 || time.Now().After(drainDeadline) || ctx.Err() != nil {
			for a := range accepted {
				if !done[a] && len(s.LostAttempts) < 10 {
					s.LostAttempts = append(s.LostAttempts, a+" "+f.describeAttempt(a))
				}
			}
			break
		}
		<-tick.C
	}
	tick.Stop()
}

// closeFleet records the leases' and the fleet's counters and closes the
// fleet.
func (r *runner) closeFleet(ctx context.Context) {
	s, f := r.s, r.f
	s.Leases = r.leases.Stats()
	st := f.AgentStats()
	s.Reconnects, s.HeartbeatTimeouts, s.Drops = st.Reconnects, st.HeartbeatTimeouts, f.Drops()
	s.LogFinalizeFailed, s.OutputsUploaded, s.OutputsFailed = st.LogFinalizeFailed, st.OutputsUploaded, st.OutputsFailed
	s.Failed = f.Reasons()
	s.AgentWarnings = f.Warnings()
	s.FailedTotal = f.failed.Load()
	s.AttemptsTotal = f.attempts.Load()
	if err := f.Close(30 * time.Second); err != nil {
		s.Violations = append(s.Violations, err.Error())
	}
	s.TimedOut = ctx.Err() != nil
}

// rawEchoSize is the raw steady echo's message: about a heartbeat and its
// envelope, as BenchmarkHeartbeatCPU's raw echo.
const rawEchoSize = 64

// defaultHeartbeat is the daemon's default heartbeat interval
// (daemon.DefaultHeartbeatInterval; not imported for one constant).
const defaultHeartbeat = 10 * time.Second

// rawBaseline is the raw phase: the raw herd and the raw baseline of the
// backend with N connections, and the fleet's ratios to them.
func (r *runner) rawBaseline(ctx context.Context) {
	o, s, d, p := r.o, r.s, r.d, r.p
	rb := o.Backend
	if o.DaemonBin != "" {
		_ = d.Close() // the raw server gets the cores to itself too
	}
	budget := func() time.Duration { return min(max(time.Until(deadlineOf(ctx)), time.Second), 3*time.Minute) }
	// The herd first: every client at once, as the fleet started
	// (its memory is not the baseline's: transient handshake state).
	if herd, err := RawBaseline(ctx, rb, p, o.N, o.N, max(o.SourceAddrs, 1), budget(), RawSteady{}); err != nil {
		s.Violations = append(s.Violations, "raw herd: "+err.Error())
	} else {
		s.RawHerd = herd
		s.Admission = admissionRatios(s)
	}
	// The steady echo: the raw connections echo a heartbeat-sized 64 bytes
	// at the interval the fleet lived, over as long a window.
	var echo RawSteady
	if o.Steady > 0 {
		echo = RawSteady{Interval: s.Steady.ObservedInterval, Window: o.Steady, Size: rawEchoSize}
		if r.prof != nil { // --profile: the raw server's heap beside the daemon's
			echo.HeapProfile = filepath.Join(o.Dir, "raw-heap.pprof")
		}
		if echo.Interval <= 0 {
			echo.Interval = cmp.Or(o.Heartbeat, defaultHeartbeat)
		}
	}
	raw, err := RawBaseline(ctx, rb, p, o.N, 64, max(o.SourceAddrs, 1), budget(), echo)
	if err != nil {
		s.Violations = append(s.Violations, "raw baseline: "+err.Error())
	} else {
		s.Raw = raw
		if raw.RSSPerConn > 0 {
			s.RSSRatio = s.Daemon.RSSPerAgent / raw.RSSPerConn
		}
		if raw.HeapPerConn > 0 && s.Daemon.HeapPerAgent > 0 {
			s.HeapRatio = s.Daemon.HeapPerAgent / raw.HeapPerConn
		}
	}
}

func deadlineOf(ctx context.Context) time.Time {
	if t, ok := ctx.Deadline(); ok {
		return t
	}
	return time.Now().Add(time.Minute)
}

// waitRound waits for r (or ctx) and describes it.
func (s *Summary) waitRound(ctx context.Context, f *Fleet, r *Round) RoundResult {
	select {
	case <-r.Done():
	case <-ctx.Done():
	}
	end := time.Now()
	rr := RoundResult{Complete: r.Pending() == 0, Pending: r.Pending(), Took: r.Took()}
	if !rr.Complete {
		rr.Took = end.Sub(r.Start)
	}
	rr.PeakPerSecond = f.PeakRegistrations(r.Start, end)
	return rr
}

func attemptStats(a []int64) AttemptStats {
	var st AttemptStats
	if len(a) == 0 {
		return st
	}
	var sum int64
	for _, v := range a {
		sum += v
	}
	st.Mean = float64(sum) / float64(len(a))
	st.P50, st.Max = a[len(a)/2], a[len(a)-1]
	return st
}

func procCPU(d *Daemon) float64 {
	ps, err := d.Proc()
	if err != nil {
		return -1
	}
	return ps.CPUSeconds
}

// handshakesOf reads the daemon listener's handshake admission counters
// (forgeyard_transport_handshakes_total of backend) after the cold start;
// nil when the backend does not queue handshakes (yamux) or the daemon
// does not export them.
func handshakesOf(ctx context.Context, d *Daemon, backend string) *HandshakeCounts {
	m, err := d.Metrics(ctx, "forgeyard_transport_handshakes_total")
	if err != nil {
		return nil
	}
	get := func(event string) int64 {
		return int64(m[`forgeyard_transport_handshakes_total{backend="`+backend+`",event="`+event+`"}`])
	}
	h := &HandshakeCounts{Started: get("started"), Completed: get("completed"), Refused: get("refused"),
		TimedOut: get("timed_out"), Failed: get("failed"), Signed: get("signed")}
	if h.Started == 0 && h.Refused == 0 {
		return nil
	}
	return h
}

// goStats are the daemon's Go runtime figures from its /metrics (zero
// when it does not export the Go collector).
type goStats struct {
	heap, goroutines, stack int64
	unreturned              int64 // free heap not yet returned to the OS
}

func goStatsOf(ctx context.Context, d *Daemon) goStats {
	m, err := d.Metrics(ctx, "go_memstats_heap_alloc_bytes", "go_goroutines", "go_memstats_stack_inuse_bytes",
		"go_memstats_heap_idle_bytes", "go_memstats_heap_released_bytes")
	if err != nil {
		return goStats{}
	}
	return goStats{heap: int64(m["go_memstats_heap_alloc_bytes"]), goroutines: int64(m["go_goroutines"]),
		stack:      int64(m["go_memstats_stack_inuse_bytes"]),
		unreturned: int64(m["go_memstats_heap_idle_bytes"] - m["go_memstats_heap_released_bytes"])}
}

// healthPoller times GET /healthz every 500 ms, by phase ("herd" until the
// cold start completed, then "steady").
type healthPoller struct {
	d     *Daemon
	mu    sync.Mutex
	phase string
	lat   map[string][]time.Duration
}

func newHealthPoller(d *Daemon) *healthPoller {
	return &healthPoller{d: d, phase: "herd", lat: map[string][]time.Duration{}}
}

func (h *healthPoller) setPhase(p string) {
	h.mu.Lock()
	h.phase = p
	h.mu.Unlock()
}

func (h *healthPoller) run(ctx context.Context) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		took, _, err := h.d.Healthz(rctx)
		cancel()
		if err == nil {
			h.mu.Lock()
			h.lat[h.phase] = append(h.lat[h.phase], took)
			h.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (h *healthPoller) percentiles(phase string) (time.Duration, time.Duration) {
	h.mu.Lock()
	l := sortDurations(h.lat[phase])
	h.mu.Unlock()
	return stats.Percentile(l, 50), stats.Percentile(l, 99)
}
