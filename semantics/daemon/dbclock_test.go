package daemon_test

import (
	"context"
	"sync/atomic"
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

// sweepCounter counts the sweeps (ExpiredLeases calls) made through it;
// Unwrap keeps the store's Clock and SweepElector visible.
type sweepCounter struct {
	authority.Authority
	sweeps atomic.Int64
}

func (s *sweepCounter) ExpiredLeases(ctx context.Context, before time.Time, limit int) ([]authority.Lease, error) {
	s.sweeps.Add(1)
	return s.Authority.ExpiredLeases(ctx, before, limit)
}

func (s *sweepCounter) Unwrap() authority.Authority { return s.Authority }

// TestLeaseExpiryDatabaseClock (issue 15 item 2): two daemons share one
// PostgreSQL authority; daemon B's clock runs 10 minutes ahead and B is
// the elected sweeper. Lease expiry is judged by the database's clock:
//
//   - a lease renewed through daemon A (right clock) is not revoked by B's
//     sweeps (judged on B's clock, it would be 10 minutes past expiry and
//     revoked at B's first sweep);
//   - a lease offered and renewed through B is stored with an expiry on
//     the database clock (now + TTL, not 10 minutes later), and B's
//     offers and renewals tell the agent times on B's clock, so the agent
//     (which relates them to B's clock) runs the attempt;
//   - both attempts complete exactly once.
func TestLeaseExpiryDatabaseClock(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.Shared(t).NewDatabase(t)
	open := func() authority.Authority {
		a, err := authority.OpenPostgres(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		return a
	}
	const skew = 10 * time.Minute
	const ttl, grace = 2 * time.Second, 500 * time.Millisecond
	timing := func(c *daemon.Config) {
		c.Timing.LeaseTTL, c.Timing.RevokeGrace = ttl, grace
		c.Timing.RenewInterval = 100 * time.Millisecond
		c.Timing.RequestTimeout = 5 * time.Second
		c.Timing.HeartbeatInterval = time.Second
	}
	storeB := &sweepCounter{Authority: open()}
	// B leads the sweep: it takes the lock before A exists.
	if lead, err := authority.SweepElectorOf(storeB).SweepLeader(ctx); err != nil || !lead {
		t.Fatalf("daemon B's store is not the sweep leader: %v, %v", lead, err)
	}
	if authority.ClockOf(storeB) == nil {
		t.Fatal("the PostgreSQL store has no database clock")
	}
	b := enginetest.QuicBackend()
	pki := trusttest.NewPKI(t)
	wa := enginetest.NewWorldWith(t, b, pki, open(), timing, func(c *daemon.Config) { c.ID = "daemon-a" })
	wb := enginetest.NewWorldWith(t, b, pki, storeB, timing, func(c *daemon.Config) {
		c.ID = "daemon-b"
		c.Now = func() time.Time { return time.Now().Add(skew) }
	})

	// A lease through A, swept by B.
	execA := enginetest.NewCountingExec(true)
	idA := wa.NewIdentity()
	wa.StartAgent(idA, execA, func(c *agent.Config) { c.RequestTimeout = 5 * time.Second })
	wa.AwaitActive(idA.Runner)
	go func() { _, _ = wa.D.OfferLease(ctx, idA.Runner, enginetest.Offer(1)) }()
	jobA := enginetest.AwaitStart(t, execA)
	// B's sweeps in the next 2·(TTL+grace): the lease's first expiry
	// (had it not been renewed) passes meanwhile.
	from, until := storeB.sweeps.Load(), time.Now().Add(2*(ttl+grace))
	for time.Now().Before(until) || storeB.sweeps.Load() < from+10 {
		if time.Now().After(until.Add(30 * time.Second)) {
			t.Fatalf("daemon B swept %d times", storeB.sweeps.Load()-from)
		}
		time.Sleep(20 * time.Millisecond) // the scenario's duration; sweeps are counted
	}
	la, err := storeB.Lease(ctx, jobA.Lease)
	if err != nil || la.State != authority.LeaseAccepted {
		t.Fatalf("lease renewed through A after %d sweeps of the skewed daemon B = %+v, %v; want accepted", storeB.sweeps.Load()-from, la, err)
	}
	if n := wb.D.Stats().LeasesRevoked; n != 0 {
		t.Fatalf("daemon B revoked %d leases", n)
	}

	// A lease through B: offered, accepted and renewed on the skewed daemon.
	execB := enginetest.NewCountingExec(true)
	idB := wb.NewIdentity()
	wb.StartAgent(idB, execB, func(c *agent.Config) { c.RequestTimeout = 5 * time.Second })
	wb.AwaitActive(idB.Runner)
	offered := make(chan error, 1)
	go func() { _, err := wb.D.OfferLease(ctx, idB.Runner, enginetest.Offer(2)); offered <- err }()
	jobB := enginetest.AwaitStart(t, execB)
	if err := <-offered; err != nil {
		t.Fatalf("offer through daemon B: %v", err)
	}
	renewalsFrom := wb.D.Stats().Renewals
	deadline := time.Now().Add(30 * time.Second)
	for wb.D.Stats().Renewals < renewalsFrom+3 {
		if time.Now().After(deadline) {
			t.Fatal("the agent on daemon B never renewed")
		}
		time.Sleep(10 * time.Millisecond) // counter: no event to await
	}
	lb, err := storeB.Lease(ctx, jobB.Lease)
	if err != nil {
		t.Fatal(err)
	}
	// The test host's clock is the database's (one machine).
	if left := time.Until(lb.ExpiresAt); left > ttl+time.Second || lb.State != authority.LeaseAccepted {
		t.Fatalf("lease renewed through the skewed daemon B expires in %v (%s), want ≤ TTL %v: written on B's clock", left, lb.State, ttl)
	}

	close(execA.Release)
	wa.AwaitCompletion(jobA.Attempt, agentwire.AckAccepted)
	close(execB.Release)
	wb.AwaitCompletion(jobB.Attempt, agentwire.AckAccepted)
	for _, j := range []struct {
		name string
		exec *enginetest.CountingExec
		job  agent.Job
	}{{"A", execA, jobA}, {"B", execB, jobB}} {
		if n, _ := storeB.Completions(ctx, j.job.Attempt); n != 1 || j.exec.Count(j.job.Attempt) != 1 {
			t.Fatalf("attempt through %s: %d completions, %d runs", j.name, n, j.exec.Count(j.job.Attempt))
		}
	}
}
