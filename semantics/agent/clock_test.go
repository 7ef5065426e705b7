package agent_test

import (
	"context"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// TestSkewedAgentClock (§146–148, issue 16 item 6): an agent whose clock
// is minutes ahead of or behind the daemon's judges lease expiry on the
// daemon's clock (ServerTimeV1 and the server time of every answer): its
// lease offer is not refused as expired, renewals keep the attempt running
// past several TTLs, and once renewals stop (the daemon is gone) the
// attempt is stopped when the lease expires on the daemon's clock plus
// the grace — neither at once nor minutes late.
func TestSkewedAgentClock(t *testing.T) {
	for _, skew := range []time.Duration{5 * time.Minute, -5 * time.Minute} {
		t.Run(skew.String(), func(t *testing.T) {
			enginetest.AllBackends(t, func(t *testing.T, b enginetest.Backend) {
				const ttl, grace = time.Second, 200 * time.Millisecond
				w := enginetest.NewWorld(t, b, func(c *daemon.Config) { c.Timing.LeaseTTL = ttl })
				id := w.NewIdentity()
				exec := enginetest.NewCountingExec(true)
				stopped := make(chan time.Time, 4)
				a, _, _ := w.StartAgent(id, exec, func(c *agent.Config) {
					c.Now = func() time.Time { return time.Now().Add(skew) }
					c.LeaseGrace = grace
					c.Hooks.OnCancel = func(wire.JobAttemptId, agentwire.CancellationReason) { stopped <- time.Now() }
				})
				w.AwaitActive(id.Runner)
				off, ok := a.ClockOffset()
				if !ok || (off+skew).Abs() > time.Second {
					t.Fatalf("clock offset %v (known %v), want about %v", off, ok, -skew)
				}
				l, err := w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(60))
				if err != nil {
					t.Fatalf("offer to a skewed agent: %v (refused as expired on its own clock?)", err)
				}
				enginetest.AwaitStart(t, exec)
				// Several TTLs with renewals: no early expiry.
				select {
				case <-stopped:
					t.Fatal("the attempt was stopped while its lease was being renewed")
				case <-time.After(2*ttl + grace):
				}
				if st := a.Stats(); st.LeasesExpired != 0 || st.Cancels != 0 {
					t.Fatalf("stats %+v", st)
				}
				// The daemon goes away: no renewal reaches it any more.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				gone := time.Now()
				_ = w.D.Shutdown(ctx)
				lr, err := w.Auth.Lease(context.Background(), l.ID)
				if err != nil {
					t.Fatal(err)
				}
				// The lease's last expiry on the daemon's clock, as a local
				// instant (daemon and test share the real clock).
				expiry := lr.ExpiresAt
				select {
				case at := <-stopped:
					// The offset estimate is off by at most half the round
					// trip of its sample (tens of ms on a loaded machine).
					if at.Before(expiry.Add(grace - 250*time.Millisecond)) {
						t.Fatalf("stopped %v before the lease expiry + grace (%v after the daemon left)", expiry.Add(grace).Sub(at), at.Sub(gone))
					}
					if late := at.Sub(expiry.Add(grace)); late > 1500*time.Millisecond {
						t.Fatalf("stopped %v after the lease expiry + grace", late)
					}
					t.Logf("%s skew %v: stopped %v after the daemon left, %v after expiry + grace", b.Name, skew,
						at.Sub(gone).Round(time.Millisecond), at.Sub(expiry.Add(grace)).Round(time.Millisecond))
				case <-time.After(ttl + grace + 3*time.Second):
					t.Fatal("the attempt overran its lease: never stopped after renewals ended")
				}
				if st := a.Stats(); st.LeasesExpired != 1 {
					t.Errorf("LeasesExpired %d, want 1", st.LeasesExpired)
				}
			})
		})
	}
}
