package daemon_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/telemetry/authmetrics"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// gatedExec runs each attempt once it is released: attempts started
// before release wait for it (or for their cancellation).
type gatedExec struct {
	mu      sync.Mutex
	runs    map[wire.JobAttemptId]int
	started chan wire.JobAttemptId
	release chan struct{}
}

func newGatedExec() *gatedExec {
	return &gatedExec{runs: map[wire.JobAttemptId]int{}, started: make(chan wire.JobAttemptId, 256), release: make(chan struct{})}
}

func (e *gatedExec) Execute(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
	e.mu.Lock()
	e.runs[job.Attempt]++
	e.mu.Unlock()
	e.started <- job.Attempt
	out.Phase(agentwire.PhaseRunning)
	select {
	case <-e.release:
		return agent.Result{Kind: agentwire.ResultSucceeded}
	case <-ctx.Done():
		return agent.Result{Kind: agentwire.ResultCancelled}
	}
}

func (e *gatedExec) count(a wire.JobAttemptId) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runs[a]
}

// TestAuthorityOutagePostgres (issue 15 item 7): agents on QUIC run
// leases on a daemon whose authority is a real PostgreSQL server; the
// server is stopped (pg_ctl stop -m immediate: a crash) while every agent
// holds running attempts, and started again on the same data directory
// and port. During the outage the attempts finish and their completions,
// renewals, a new agent's registration and a new offer fail: the daemon
// logs the causes (rate-limited), counts outcome="error", and answers the
// agents Internal/RetryBackoff with the safe text. After the restart,
// with no intervention, every completion is recorded exactly once, the
// new agent registers, and leases offered afterwards run: nothing is lost.
func TestAuthorityOutagePostgres(t *testing.T) {
	// Its own server, since this test stops it, and a durable one: the
	// outage is an immediate stop, and the functional tests' fast server
	// (synchronous_commit off) loses the commits of its last few hundred
	// milliseconds then — leases the agents were told they hold, whose
	// completions came back StaleRejected in about one run in ten. A
	// database that acknowledges what it may lose cannot show that
	// nothing is lost.
	srv, err := pgtest.StartWith(pgtest.Options{Durable: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	dsn := srv.NewDatabase(t)
	ctx := context.Background()
	store, err := authority.OpenPostgres(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	m := telemetry.NewMetrics()
	b := enginetest.QuicBackend()
	w := enginetest.NewWorldWith(t, b, trusttest.NewPKI(t), authmetrics.Instrument(m, store), func(c *daemon.Config) {
		c.ID = "outage-daemon"
		c.Metrics = m
		// Leases outlive the outage: an outage longer than TTL+grace
		// revokes them at the first sweep after it (leases.md). The
		// rest is slower than FastTiming: 4 agents under -race on a
		// shared machine must not miss heartbeats or time out on a
		// healthy database.
		c.Timing = daemon.Timing{HeartbeatInterval: time.Second, RenewInterval: 500 * time.Millisecond,
			LeaseTTL: 30 * time.Second, RevokeGrace: 2 * time.Second, RegistrationTimeout: 10 * time.Second,
			RequestTimeout: 3 * time.Second, MaxBackoff: 200 * time.Millisecond}
	})

	exec := newGatedExec()
	var doneMu sync.Mutex
	done := map[wire.JobAttemptId][]agentwire.CompletionAckKind{} // agent side: OnAttemptDone
	onDone := func(c *agent.Config) {
		c.RequestTimeout = 3 * time.Second
		c.Hooks.OnAttemptDone = func(d agent.AttemptDone) {
			doneMu.Lock()
			done[d.Job.Attempt] = append(done[d.Job.Attempt], d.Ack)
			doneMu.Unlock()
		}
	}
	const nAgents, perAgent = 3, 5
	var ids []enginetest.Identity
	var agents []*agent.Agent
	for range nAgents {
		id := w.NewIdentity()
		a, _, _ := w.StartAgent(id, exec, onDone)
		ids, agents = append(ids, id), append(agents, a)
	}
	for _, id := range ids {
		w.AwaitActive(id.Runner)
	}

	// offer offers one lease to runner in the background; the attempts
	// offered go to attempts.
	var attemptsMu sync.Mutex
	var attempts []wire.JobAttemptId
	var offers sync.WaitGroup
	offerErrs := make(chan error, 64)
	seq := 0
	offer := func(runner wire.RunnerId) {
		seq++
		o := enginetest.Offer(seq)
		o.Attempt = wire.NewJobAttemptId()
		attemptsMu.Lock()
		attempts = append(attempts, o.Attempt)
		attemptsMu.Unlock()
		offers.Add(1)
		go func() {
			defer offers.Done()
			octx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			if _, err := w.D.OfferLease(octx, runner, o); err != nil {
				offerErrs <- err
			}
		}()
	}
	awaitStarts := func(n int) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for i := 0; i < n; i++ {
			select {
			case <-exec.started:
			case err := <-offerErrs:
				t.Fatalf("offer failed: %v; daemon log tail:\n%s", err, tail(w.LogBuf.String(), 40))
			case <-deadline:
				t.Fatalf("%d of %d attempts started; daemon log tail:\n%s", i, n, tail(w.LogBuf.String(), 40))
			}
		}
	}
	for _, id := range ids {
		for range perAgent {
			offer(id.Runner)
		}
	}
	awaitStarts(nAgents * perAgent)
	offers.Wait() // every offer accepted and recorded
	select {
	case err := <-offerErrs:
		t.Fatalf("offer failed: %v; daemon log tail:\n%s", err, tail(w.LogBuf.String(), 40))
	default:
	}

	// The outage.
	if err := srv.StopServer("immediate"); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	// A host's offer during the outage is refused with the cause.
	octx, ocancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = w.D.OfferLease(octx, ids[0].Runner, enginetest.Offer(999))
	ocancel()
	if err == nil {
		t.Fatal("OfferLease succeeded with the authority down")
	}
	// A new agent cannot register: it is told to retry and keeps trying.
	late := w.NewIdentity()
	lateAgent, _, _ := w.StartAgent(late, exec, onDone)
	agents = append(agents, lateAgent)

	failed := func() daemon.AuthorityFailureStats { return w.D.AuthorityFailures() }
	// The running attempts' renewals and the late agent's registration
	// meet the dead database first; then every running attempt completes
	// against it (released only now: attempts that completed at once sent
	// no renewal, and a CI run under load missed the renew path).
	awaitPaths := func(what string, done func(f daemon.AuthorityFailureStats) bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for f := failed(); !done(f); f = failed() {
			if time.Now().After(deadline) {
				t.Fatalf("the outage was not met on %s: %+v", what, f)
			}
			time.Sleep(10 * time.Millisecond) // counters: no event to await
		}
	}
	awaitPaths("the renew and register paths", func(f daemon.AuthorityFailureStats) bool {
		return f.ByOperation["renew"] > 0 && f.ByOperation["register"]+f.ByOperation["check_credentials"] > 0
	})
	close(exec.release) // every running attempt completes now: against the dead database
	awaitPaths("the complete path", func(f daemon.AuthorityFailureStats) bool {
		return f.ByOperation["complete"] >= nAgents*perAgent
	})
	// Nothing was acknowledged meanwhile.
	select {
	case c := <-w.Ev.Completions:
		t.Fatalf("completion %s acknowledged (%s) with the authority down", c.Attempt, c.Ack)
	default:
	}
	if d := time.Since(down); d < 2*time.Second {
		time.Sleep(2*time.Second - d) // the outage lasts a few seconds (the scenario, not a synchronization)
	}
	if err := srv.StartServer(); err != nil {
		t.Fatal(err)
	}
	t.Logf("authority down for %v; failures %+v", time.Since(down), failed())

	// Recovery, with no intervention: every completion is recorded, the
	// late agent registers, new offers run.
	attemptsMu.Lock()
	before := append([]wire.JobAttemptId(nil), attempts...)
	attemptsMu.Unlock()
	acks := map[wire.JobAttemptId][]agentwire.CompletionAckKind{}
	collect := func(want []wire.JobAttemptId) {
		t.Helper()
		deadline := time.After(60 * time.Second)
		for {
			missing := 0
			for _, a := range want {
				if len(acks[a]) == 0 {
					missing++
				}
			}
			if missing == 0 {
				return
			}
			select {
			case c := <-w.Ev.Completions:
				acks[c.Attempt] = append(acks[c.Attempt], c.Ack)
			case <-deadline:
				t.Fatalf("%d of %d completions never acknowledged after the restart; daemon log tail:\n%s", missing, len(want), tail(w.LogBuf.String(), 30))
			}
		}
	}
	collect(before)
	w.AwaitActive(late.Runner)
	for _, id := range append(ids, late) {
		offer(id.Runner)
		offer(id.Runner)
	}
	awaitStarts(2 * (nAgents + 1))
	offers.Wait()
	select {
	case err := <-offerErrs:
		t.Fatalf("offer after the restart failed: %v", err)
	default:
	}
	attemptsMu.Lock()
	all := append([]wire.JobAttemptId(nil), attempts...)
	attemptsMu.Unlock()
	collect(all)

	// Exactly once: one accepted completion per attempt in the daemon's
	// hooks, the agents' acks and the database; one execution each. An
	// agent whose ack was slow under load may send its completion again:
	// the daemon then answers DuplicateAccepted (it recorded nothing new),
	// which is the protocol working, not a second completion.
	for _, a := range all {
		got := acks[a]
		accepted := 0
		for _, k := range got {
			switch k {
			case agentwire.AckAccepted:
				accepted++
			case agentwire.AckDuplicateAccepted:
			default:
				accepted = -1 << 10
			}
		}
		if accepted != 1 || got[0] != agentwire.AckAccepted {
			t.Errorf("attempt %s: daemon acks %v, want one Accepted first (then only DuplicateAccepted); its daemon log:\n%s", a, got, grepLines(w.LogBuf.String(), a.String()))
		}
		if n := exec.count(a); n != 1 {
			t.Errorf("attempt %s ran %d times", a, n)
		}
		n, err := store.Completions(ctx, a)
		if err != nil || n != 1 {
			t.Errorf("attempt %s: %d completions recorded (%v)", a, n, err)
		}
	}
	// The agent hook runs after the ack it reports is read; wait for the
	// last of them.
	deadline := time.Now().Add(10 * time.Second)
	for {
		doneMu.Lock()
		n := len(done)
		doneMu.Unlock()
		if n >= len(all) || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	doneMu.Lock()
	for _, a := range all {
		if got := done[a]; len(got) != 1 || got[0] != agentwire.AckAccepted {
			t.Errorf("attempt %s: agent saw acks %v, want one Accepted", a, got)
		}
	}
	doneMu.Unlock()

	// What the operator and the agents saw.
	var retried int64
	for _, a := range agents {
		retried += a.Stats().CompletionsRetried
	}
	if retried < nAgents*perAgent {
		t.Errorf("agents retried %d completions, want ≥ %d (each was refused at least once)", retried, nAgents*perAgent)
	}
	_, fams := enginetest.ScrapeFamilies(t, m)
	if v := enginetest.FamilyValue(fams, "forgeyard_transport_messages_total", "outcome", "error"); v <= 0 {
		t.Errorf(`messages_total{outcome="error"} = %v, want > 0`, v)
	}
	if v := enginetest.FamilyValue(fams, "forgeyard_transport_protocol_errors_total", "code", "Internal"); v < nAgents*perAgent {
		t.Errorf(`protocol_errors_total{code="Internal"} = %v, want ≥ %d (one per refused completion at least)`, v, nAgents*perAgent)
	}
	if v := enginetest.FamilyValue(fams, "forgeyard_authority_errors_total", "kind", "failed"); v <= 0 {
		t.Errorf(`authority_errors_total{kind="failed"} = %v, want > 0`, v)
	}
	if v := enginetest.FamilyValue(fams, "forgeyard_transport_registration_failures_total"); v <= 0 {
		t.Errorf("registration_failures_total = %v, want > 0 (the late agent was refused)", v)
	}
	f := failed()
	logs := w.LogBuf.String()
	stable := failed().Failures == f.Failures // no failure between the two reads
	lines := strings.Count(logs, `"msg":"authority unavailable"`)
	if lines == 0 || !strings.Contains(logs, `"op":"complete"`) || !strings.Contains(logs, `"op":"renew"`) {
		t.Errorf("authority failures not logged with their operation; log tail:\n%s", tail(logs, 20))
	}
	if (stable && int64(lines)+f.LogsSuppressed != f.Failures) || f.LogsSuppressed == 0 {
		t.Errorf("%d lines logged + %d suppressed, want %d failures with some suppressed (rate limit)", lines, f.LogsSuppressed, f.Failures)
	}
	if strings.Contains(logs, `"err":""`) {
		t.Error("an authority failure was logged without its cause")
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}
