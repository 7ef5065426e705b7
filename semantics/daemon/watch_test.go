package daemon_test

import (
	"context"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// cancelExec blocks every job until its context ends and reports when.
type cancelExec struct {
	started   chan agent.Job
	cancelled chan time.Time
}

func (e *cancelExec) Execute(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
	e.started <- job
	out.Phase(agentwire.PhaseRunning)
	<-ctx.Done()
	e.cancelled <- time.Now()
	return agent.Result{Kind: agentwire.ResultCancelled}
}

// TestCrossDaemonCancelNotified (issue 15 item 2): two daemons share
// PostgreSQL; the agent runs an attempt on daemon B; the attempt is
// cancelled through daemon A, which does not hold the agent. B learns it by
// LISTEN/NOTIFY and delivers the cancel: the agent's executor is cancelled
// within 1 s, although the agent renews only every 30 s.
func TestCrossDaemonCancelNotified(t *testing.T) {
	b := enginetest.QuicBackend()
	dsn := pgtest.Shared(t).NewDatabase(t)
	open := func() authority.Authority {
		a, err := authority.OpenPostgres(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		return a
	}
	slowRenew := func(c *daemon.Config) {
		c.Timing.RenewInterval = 30 * time.Second
		c.Timing.LeaseTTL = 2 * time.Minute
	}
	pki := trusttest.NewPKI(t)
	wa := enginetest.NewWorldWith(t, b, pki, open(), sharedDB, slowRenew, func(c *daemon.Config) { c.ID = "daemon-a" })
	wb := enginetest.NewWorldWith(t, b, pki, open(), sharedDB, slowRenew, func(c *daemon.Config) { c.ID = "daemon-b" })
	id := wb.NewIdentity()
	exec := &cancelExec{started: make(chan agent.Job, 1), cancelled: make(chan time.Time, 1)}
	wb.StartAgent(id, exec)
	wb.AwaitActive(id.Runner)
	go func() { _, _ = wb.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(1)) }()
	var job agent.Job
	select {
	case job = <-exec.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the attempt did not start")
	}
	start := time.Now()
	if err := wa.D.CancelAttempt(context.Background(), job.Attempt, agentwire.CancelUserRequested); err != nil {
		t.Fatalf("cancel on daemon A: %v", err)
	}
	select {
	case at := <-exec.cancelled:
		delay := at.Sub(start)
		t.Logf("cancel on daemon A reached the agent on daemon B after %v", delay)
		if delay > time.Second {
			t.Fatalf("cancel delivered after %v, want within 1 s", delay)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the agent was not cancelled within 5 s")
	}
	wb.AwaitCompletion(job.Attempt, agentwire.AckAccepted)
}
