package daemon_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// renewBeforeExpire is an authority where, just before the sweep's
// ExpireLease of lease `renew` reaches the store, the agent's renewal of that
// lease commits (as through another daemon of an HA pair): the race between
// the sweep's ExpiredLeases and its revoke, made deterministic.
type renewBeforeExpire struct {
	authority.Authority
	renew   authority.Lease
	ref     authority.SessionRef
	mu      sync.Mutex
	renewed authority.RenewResult
	expired map[wire.LeaseId]bool // ExpireLease answers, by lease
	sweeps  int                   // ExpiredLeases calls after both answers
	done    chan struct{}         // closed at the first sweep after both answers
}

func (r *renewBeforeExpire) ExpiredLeases(ctx context.Context, before time.Time, limit int) ([]authority.Lease, error) {
	r.mu.Lock()
	if len(r.expired) == 2 {
		// The sweep loop is sequential: the previous sweep, which saw both
		// answers, has finished acting on them.
		if r.sweeps++; r.sweeps == 1 {
			close(r.done)
		}
	}
	r.mu.Unlock()
	return r.Authority.ExpiredLeases(ctx, before, limit)
}

func (r *renewBeforeExpire) ExpireLease(ctx context.Context, id wire.LeaseId, before time.Time) (bool, error) {
	if id == r.renew.ID {
		res, err := r.Authority.RenewLease(ctx, wire.NewMessageId(), id, r.renew.Attempt, r.ref, time.Now())
		if err != nil {
			return false, err
		}
		r.mu.Lock()
		r.renewed = res
		r.mu.Unlock()
	}
	expired, err := r.Authority.ExpireLease(ctx, id, before)
	if err == nil {
		r.mu.Lock()
		r.expired[id] = expired
		r.mu.Unlock()
	}
	return expired, err
}

// TestExpirySweepKeepsRenewedLease: the expiry sweep lists two leases long
// past their expiry and grace; one is renewed after the listing and before
// the sweep's revoke. The sweep expires only the other: the renewed lease
// stays live with its renewed expiry, and LeasesRevoked counts one lease.
// (Before ExpireLease the sweep revoked both with RevokeLease.)
func TestExpirySweepKeepsRenewedLease(t *testing.T) {
	for _, store := range []struct {
		name string
		open func(t *testing.T) authority.Authority
	}{
		{"sqlite", func(t *testing.T) authority.Authority {
			a, err := authority.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "authority.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = a.Close() })
			return a
		}},
		{"postgres", func(t *testing.T) authority.Authority {
			a, err := authority.OpenPostgres(context.Background(), pgtest.Shared(t).NewDatabase(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = a.Close() })
			return a
		}},
	} {
		t.Run(store.name, func(t *testing.T) {
			ctx := context.Background()
			auth := store.open(t)
			now := time.Now()
			// The agent session lives on "another daemon": registered in the
			// shared store, unknown to the daemon under test.
			runner, session := wire.NewRunnerId(), wire.NewAgentSessionId()
			g, err := auth.RegisterSession(ctx, authority.Registration{Runner: runner, Session: session,
				Transport: wire.NewTransportSessionId(), Daemon: "d2", Now: now})
			if err != nil {
				t.Fatal(err)
			}
			lease := func() authority.Lease {
				l := authority.Lease{ID: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId(), Job: wire.NewJobId(), Runner: runner,
					Session: session, TTL: time.Hour, ExpiresAt: now.Add(-time.Hour), CreatedAt: now.Add(-2 * time.Hour), State: authority.LeaseAccepted}
				if err := auth.CreateLease(ctx, l); err != nil {
					t.Fatal(err)
				}
				return l
			}
			renewed, abandoned := lease(), lease()
			wrap := &renewBeforeExpire{Authority: auth, renew: renewed, ref: authority.SessionRef{Session: session, Epoch: g.Epoch},
				expired: map[wire.LeaseId]bool{}, done: make(chan struct{})}
			w := enginetest.NewWorldWith(t, enginetest.MemoryBackend(), trusttest.NewPKI(t), wrap, func(c *daemon.Config) {
				c.Timing.RenewInterval = 20 * time.Millisecond
				c.Timing.RevokeGrace = time.Second
			})
			select {
			case <-wrap.done:
			case <-time.After(20 * time.Second):
				wrap.mu.Lock()
				defer wrap.mu.Unlock()
				t.Fatalf("the sweep did not expire both leases: answers %v", wrap.expired)
			}
			wrap.mu.Lock()
			res, answers := wrap.renewed, wrap.expired
			wrap.mu.Unlock()
			if !res.Extended {
				t.Fatalf("renewal in between = %+v, want Extended", res)
			}
			if answers[renewed.ID] || !answers[abandoned.ID] {
				t.Fatalf("ExpireLease answers = %v; want renewed %s kept, abandoned %s expired", answers, renewed.ID, abandoned.ID)
			}
			got, err := auth.Lease(ctx, renewed.ID)
			if err != nil || got.State != authority.LeaseAccepted || !got.ExpiresAt.Equal(res.ExpiresAt) {
				t.Fatalf("renewed lease after the sweep = %+v, %v; want accepted until %v", got, err, res.ExpiresAt)
			}
			got, err = auth.Lease(ctx, abandoned.ID)
			if err != nil || got.State != authority.LeaseRevoked || got.RevokeReason != authority.ReasonLeaseExpired {
				t.Fatalf("abandoned lease after the sweep = %+v, %v; want revoked (%q)", got, err, authority.ReasonLeaseExpired)
			}
			if n := w.D.Stats().LeasesRevoked; n != 1 {
				t.Fatalf("LeasesRevoked = %d, want 1 (only the lease the sweep expired)", n)
			}
		})
	}
}
