package daemon_test

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// TestDuplicateLeaseDeliverySafe: offers re-sent (same MessageId) before
// the answer arrives are answered with the same answer and never start a
// second execution.
func TestDuplicateLeaseDeliverySafe(t *testing.T) {
	n := memory.NewNetwork()
	b := enginetest.MemoryBackend()
	b.Dialer = func(t *testing.T, conf *tls.Config) semantics.BackendDialer {
		// 40 ms one way: the daemon re-sends the offer every 20 ms.
		return &memory.Dialer{Network: n, TLSConfig: conf, Options: memory.Options{Latency: 40 * time.Millisecond}}
	}
	b.Listen = enginetest.ListenOn(n)
	w := enginetest.NewWorld(t, b, func(c *daemon.Config) {
		c.Timing.RenewInterval = 20 * time.Millisecond
		c.Timing.RequestTimeout = 20 * time.Millisecond
		c.Timing.HeartbeatInterval = 200 * time.Millisecond
	})
	id := w.NewIdentity()
	exec := enginetest.NewCountingExec(true)
	a, _, _ := w.StartAgent(id, exec)
	w.AwaitActive(id.Runner)
	l, err := w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(3))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for w.D.Stats().DuplicateAnswers == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // duplicates in flight arrive after the first answer
	}
	close(exec.Release)
	w.AwaitCompletion(l.Attempt, agentwire.AckAccepted)
	if c := exec.Count(l.Attempt); c != 1 {
		t.Fatalf("executor ran %d times", c)
	}
	if a.Stats().DuplicatesAbsorbed == 0 || w.D.Stats().OfferResends == 0 {
		t.Fatalf("no duplicate offer was delivered (agent %+v, daemon resends %d)", a.Stats(), w.D.Stats().OfferResends)
	}
	if w.D.Stats().DuplicateAnswers == 0 {
		t.Fatal("daemon saw no duplicate answer")
	}
}

// TestSameSessionKeepsAuthorityAcrossReconnect: an attempt keeps running
// across a transport reconnect under the same AgentSessionId (new
// transport, epoch+1) and its completion is accepted.
func TestSameSessionKeepsAuthorityAcrossReconnect(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		exec := enginetest.NewCountingExec(true)
		a, rd, _ := w.StartAgent(id, exec)
		w.AwaitActive(id.Runner)
		first := enginetest.AwaitConnected(t, a)
		go func() { _, _ = w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(5)) }()
		job := enginetest.AwaitStart(t, exec)
		rd.Cut()
		reg := w.AwaitRegistered(id.Runner) // first registration
		if reg.Epoch == 1 {
			reg = w.AwaitRegistered(id.Runner)
		}
		if reg.Session != a.Session() || reg.Epoch < 2 || reg.Transport == first.Transport {
			t.Fatalf("re-registration %+v", reg)
		}
		w.AwaitActive(id.Runner)
		close(exec.Release)
		w.AwaitCompletion(job.Attempt, agentwire.AckAccepted)
		if exec.Count(job.Attempt) != 1 {
			t.Fatal("attempt restarted after reconnect")
		}
		if w.D.Stats().Reconnects < 1 || a.Stats().Resyncs < 2 {
			t.Fatalf("daemon %+v agent %+v", w.D.Stats(), a.Stats())
		}
	})
}

// TestNewSessionDoesNotInherit: a new agent process (new AgentSessionId)
// of the same runner supersedes the old session: the old attempt's lease
// is revoked, its completion is stale, and the old session can no longer
// register.
func TestNewSessionDoesNotInherit(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		exec := enginetest.NewCountingExec(true)
		done := make(chan agent.AttemptDone, 1)
		_, _, run1 := w.StartAgent(id, exec, func(c *agent.Config) {
			c.Hooks.OnAttemptDone = func(d agent.AttemptDone) { done <- d }
		})
		w.AwaitActive(id.Runner)
		go func() { _, _ = w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(6)) }()
		job := enginetest.AwaitStart(t, exec)
		a2, _, _ := w.StartAgent(id, enginetest.NewCountingExec(false))
		enginetest.AwaitConnected(t, a2)
		// The old agent loses its transport, cannot re-register its session,
		// and its attempt is cancelled/stale.
		select {
		case err := <-run1:
			var re *agent.RejectedError
			if !errors.As(err, &re) || re.Code != wire.ErrCodeStaleSession {
				t.Fatalf("old agent Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("old agent kept running")
		}
		l, err := w.Auth.Lease(context.Background(), job.Lease)
		if err != nil {
			t.Fatal(err)
		}
		if l.State.Live() {
			t.Fatalf("old session's lease still %s", l.State)
		}
		if n, _ := w.Auth.Completions(context.Background(), job.Attempt); n != 0 {
			t.Fatal("old attempt completed")
		}
	})
}

// TestDisabledRunnerClosed: DisableRunner closes the runner's transport
// with CloseRunnerDisabled and the agent stops with RunnerDisabled.
func TestDisabledRunnerClosed(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		_, _, runErr := w.StartAgent(id, enginetest.NewCountingExec(false))
		w.AwaitActive(id.Runner)
		if err := w.D.DisableRunner(context.Background(), id.Runner, "compromised"); err != nil {
			t.Fatal(err)
		}
		// The agent re-dials once and is refused at registration; that
		// second transport's end (closed by the agent) may be reported
		// before the first one's, so look for the RunnerDisabled close
		// among the first two.
		timeout := time.After(10 * time.Second)
		var ends []error
	wait:
		for len(ends) < 2 {
			select {
			case err := <-w.Ev.Disconnects:
				ends = append(ends, err)
				var ce *semantics.ConnError
				if errors.As(err, &ce) && ce.Code == wire.CloseRunnerDisabled {
					break wait
				}
			case <-timeout:
				t.Fatalf("transport not closed with RunnerDisabled; ends seen: %v", ends)
			}
		}
		if last := ends[len(ends)-1]; !isClose(last, wire.CloseRunnerDisabled) {
			t.Fatalf("transports ended with %v, none with RunnerDisabled", ends)
		}
		select {
		case err := <-runErr:
			var re *agent.RejectedError
			if !errors.As(err, &re) || re.Code != wire.ErrCodeRunnerDisabled {
				t.Fatalf("agent Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("agent kept running")
		}
		deadline := time.Now().Add(5 * time.Second)
		for len(w.D.Sessions()) != 0 && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond) // the rejected re-dial is torn down asynchronously
		}
		if len(w.D.Sessions()) != 0 {
			t.Fatalf("sessions left: %+v", w.D.Sessions())
		}
	})
}

// TestLeaseGraceProbeSavesLease: a lease whose renewals come too late
// (TTL shorter than the renew interval) expires, is probed, and the
// agent's immediate renewal saves it: the attempt completes, nothing is
// revoked.
func TestLeaseGraceProbeSavesLease(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b, func(c *daemon.Config) {
			c.Timing.RenewInterval = 100 * time.Millisecond
			c.Timing.RevokeGrace = 300 * time.Millisecond
			// The subject is the lease's probe, not transport liveness: a
			// starved process (two test runs on 2 cores under -race) must
			// not reconnect meanwhile (once seen: 1 probe in 10 s).
			c.Timing.HeartbeatGrace = 5 * time.Second
		})
		id := w.NewIdentity()
		exec := enginetest.NewCountingExec(true)
		w.StartAgent(id, exec, func(c *agent.Config) { c.HeartbeatMisses = 50 })
		w.AwaitActive(id.Runner)
		o := enginetest.Offer(8)
		o.TTL = 40 * time.Millisecond // expires between renewals
		go func() { _, _ = w.D.OfferLease(context.Background(), id.Runner, o) }()
		job := enginetest.AwaitStart(t, exec)
		deadline := time.Now().Add(30 * time.Second)
		for w.D.Stats().Probes < 3 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // no event for "probe answered"
		}
		if w.D.Stats().Probes < 3 {
			t.Fatalf("probes %d", w.D.Stats().Probes)
		}
		close(exec.Release)
		w.AwaitCompletion(job.Attempt, agentwire.AckAccepted)
		if st := w.D.Stats(); st.LeasesRevoked != 0 {
			t.Fatalf("revoked %d leases", st.LeasesRevoked)
		}
	})
}

// TestLeaseRevokedWithoutRenewals: with probes unanswered (the agent is
// gone) the lease is revoked after the grace.
func TestLeaseRevokedAfterGrace(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b, slowHeartbeat, func(c *daemon.Config) {
			c.Timing.RenewInterval = 30 * time.Millisecond
			c.Timing.RevokeGrace = 100 * time.Millisecond
		})
		id := w.NewIdentity()
		rc := w.DialRaw(id) // accepts, never renews, ignores probes
		sess := wire.NewAgentSessionId()
		rc.Join(sess)
		o := enginetest.Offer(9)
		o.TTL = 50 * time.Millisecond
		go func() { _, _ = w.D.OfferLease(context.Background(), id.Runner, o) }()
		lo, env := enginetest.Next[*agentwire.LeaseOfferV1](t, rc)
		_ = rc.Ch.Reply(env, &agentwire.LeaseAcceptedV1{Lease: lo.Lease, Attempt: lo.Attempt, Session: sess})
		enginetest.Next[*agentwire.LeaseProbeV1](t, rc)
		c, _ := enginetest.Next[*agentwire.CancelAttemptV1](t, rc)
		if c.Reason != agentwire.CancelLeaseRevoked || c.Lease != lo.Lease {
			t.Fatalf("cancel %+v", c)
		}
		l, _ := w.Auth.Lease(context.Background(), lo.Lease)
		if l.State.Live() {
			t.Fatalf("lease %s", l.State)
		}
	})
}

// TestCancelDelivery: CancelAttempt reaches the agent at cancel priority,
// the executor's context ends, the Cancelled completion is accepted. The
// delivery latency is measured.
func TestCancelDelivery(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		exec := enginetest.NewCountingExec(true)
		done := make(chan agent.AttemptDone, 1)
		w.StartAgent(id, exec, func(c *agent.Config) { c.Hooks.OnAttemptDone = func(d agent.AttemptDone) { done <- d } })
		w.AwaitActive(id.Runner)
		go func() { _, _ = w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(10)) }()
		job := enginetest.AwaitStart(t, exec)
		start := time.Now()
		if err := w.D.CancelAttempt(context.Background(), job.Attempt, agentwire.CancelUserRequested); err != nil {
			t.Fatal(err)
		}
		acked := time.Since(start)
		select {
		case d := <-done:
			if d.Result.Kind != agentwire.ResultCancelled || d.Ack != agentwire.AckAccepted {
				t.Fatalf("done %+v", d)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("cancelled attempt never completed")
		}
		lat := w.D.Stats().CancelDelivery
		if len(lat) != 1 {
			t.Fatalf("cancel latency samples %v", lat)
		}
		t.Logf("%s: cancel delivered and acknowledged in %v (daemon sample %v)", b.Name, acked, lat[0])
	})
}

// TestDrainAndResume: a drained runner gets no leases; resume restores.
func TestDrainAndResume(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		a, _, _ := w.StartAgent(id, enginetest.NewCountingExec(false))
		w.AwaitActive(id.Runner)
		ctx := context.Background()
		if err := w.D.DrainRunner(ctx, id.Runner, "maintenance"); err != nil {
			t.Fatal(err)
		}
		if _, err := w.D.OfferLease(ctx, id.Runner, enginetest.Offer(11)); !errors.Is(err, daemon.ErrDraining) {
			t.Fatalf("offer while draining: %v", err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for !a.Status().Draining && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
		if !a.Status().Draining {
			t.Fatal("agent not draining")
		}
		if err := w.D.ResumeRunner(ctx, id.Runner); err != nil {
			t.Fatal(err)
		}
		for a.Status().Draining && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
		l, err := w.D.OfferLease(ctx, id.Runner, enginetest.Offer(12))
		if err != nil {
			t.Fatal(err)
		}
		w.AwaitCompletion(l.Attempt, agentwire.AckAccepted)
	})
}

func isClose(err error, code wire.CloseCode) bool {
	var ce *semantics.ConnError
	return errors.As(err, &ce) && ce.Code == code
}
