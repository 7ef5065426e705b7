package daemon_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// gateDialer refuses every dial once blocked: the daemon behind it became
// unreachable for new connections.
type gateDialer struct {
	inner   semantics.BackendDialer
	blocked atomic.Bool
}

var errGateBlocked = errors.New("test: endpoint unreachable")

func (g *gateDialer) Dial(ctx context.Context, addr string) (semantics.BackendConn, error) {
	if g.blocked.Load() {
		return nil, errGateBlocked
	}
	return g.inner.Dial(ctx, addr)
}

type offerResult struct {
	l   authority.Lease
	err error
}

// sharedAuthorities returns two authorities over one storage, one per
// daemon of an HA pair: one SQLite store used by both, or two PostgreSQL
// pools on one database.
var sharedAuthorities = []struct {
	name string
	open func(t *testing.T) (authority.Authority, authority.Authority)
}{
	{"sqlite", func(t *testing.T) (authority.Authority, authority.Authority) {
		a, err := authority.OpenSQLite(context.Background(), ":memory:")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		return a, a
	}},
	{"postgres", func(t *testing.T) (authority.Authority, authority.Authority) {
		dsn := pgtest.Shared(t).NewDatabase(t)
		open := func() authority.Authority {
			a, err := authority.OpenPostgres(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = a.Close() })
			return a
		}
		return open(), open()
	}},
}

// TestOfferSurvivesDaemonSwitch (§67, §227–230): daemon A offers a lease
// but the offer is lost before it reaches the agent; the agent's transport
// to A is cut and A becomes unreachable, so the agent reconnects to daemon
// B (shared authority). B re-sends the still-offered lease after the
// resync, the agent accepts and completes it exactly once through B, and
// A's OfferLease — still waiting — returns success, not ErrOfferExpired.
func TestOfferSurvivesDaemonSwitch(t *testing.T) {
	for _, sa := range sharedAuthorities {
		t.Run(sa.name, func(t *testing.T) {
			b := enginetest.MemoryBackend()
			pki := trusttest.NewPKI(t)
			authA, authB := sa.open(t)
			wa := enginetest.NewWorldWith(t, b, pki, authA, sharedDB, func(c *daemon.Config) { c.ID = "daemon-a" })
			wb := enginetest.NewWorldWith(t, b, pki, authB, sharedDB, func(c *daemon.Config) { c.ID = "daemon-b" })
			id := wa.NewIdentity()
			held := make(chan wire.LeaseId, 1)
			daemon.SetOfferFilter(wa.D, func(l wire.LeaseId) bool {
				select {
				case held <- l:
				default:
				}
				return false // every offer A sends is lost
			})
			exec := enginetest.NewCountingExec(false)
			gate := &gateDialer{}
			a, rdA, _ := wa.StartAgent(id, exec, func(c *agent.Config) {
				gate.inner = c.Endpoints[0].Dialer
				c.Endpoints[0].Dialer = gate
				c.Endpoints = append(c.Endpoints, agent.Endpoint{Address: wb.Addr, Dialer: b.Dialer(t, wb.ClientTLS(id)), Backend: b.Name})
			})
			wa.AwaitActive(id.Runner)

			o := enginetest.Offer(1)
			o.TTL = 30 * time.Second // the offer must not expire: only the switch can deliver it
			res := make(chan offerResult, 1)
			go func() {
				l, err := wa.D.OfferLease(context.Background(), id.Runner, o)
				res <- offerResult{l, err}
			}()
			var lease wire.LeaseId
			select {
			case lease = <-held:
			case r := <-res:
				t.Fatalf("OfferLease returned before any offer was sent: %+v, %v", r.l, r.err)
			case <-time.After(10 * time.Second):
				t.Fatal("daemon A never tried to send the offer")
			}
			gate.blocked.Store(true)
			cutAt := time.Now()
			if !rdA.Cut() {
				t.Fatal("no connection to daemon A to cut")
			}

			reg := wb.AwaitRegistered(id.Runner)
			if reg.Session != a.Session() || reg.Epoch < 2 {
				t.Fatalf("daemon B registration %+v, want the agent's session %s at epoch ≥ 2", reg, a.Session())
			}
			job := enginetest.AwaitStart(t, exec)
			if job.Lease != lease {
				t.Fatalf("agent ran lease %s, want the held offer %s", job.Lease, lease)
			}
			wb.AwaitCompletion(job.Attempt, agentwire.AckAccepted)

			select {
			case r := <-res:
				if r.err != nil {
					t.Fatalf("daemon A's OfferLease = %v, want success", r.err)
				}
				if r.l.ID != lease || r.l.State != authority.LeaseAccepted {
					t.Fatalf("daemon A's OfferLease returned %s in state %q, want %s accepted", r.l.ID, r.l.State, lease)
				}
				t.Logf("cut → daemon A's OfferLease settled through daemon B: %v", time.Since(cutAt))
			case <-time.After(10 * time.Second):
				t.Fatal("daemon A's OfferLease did not return after the agent accepted through daemon B")
			}
			if n, err := authB.Completions(context.Background(), job.Attempt); err != nil || n != 1 {
				t.Fatalf("completions %d, %v; want 1", n, err)
			}
			if n := exec.Count(job.Attempt); n != 1 {
				t.Fatalf("attempt ran %d times", n)
			}
			if got, err := authA.Lease(context.Background(), lease); err != nil || got.State != authority.LeaseCompleted {
				t.Fatalf("lease state %q, %v; want completed", got.State, err)
			}
			stA, stB := wa.D.Stats(), wb.D.Stats()
			if stB.OffersAdopted < 1 || stB.LeasesAccepted != 1 || stB.LeasesOffered != 0 {
				t.Fatalf("daemon B: adopted %d, accepted %d, offered %d; want ≥1, 1, 0", stB.OffersAdopted, stB.LeasesAccepted, stB.LeasesOffered)
			}
			if stA.OffersSettledElsewhere != 1 || stA.LeasesAccepted != 0 {
				t.Fatalf("daemon A: settled elsewhere %d, accepted %d; want 1, 0", stA.OffersSettledElsewhere, stA.LeasesAccepted)
			}
			if s := enginetest.AwaitConnected(t, a); s.Endpoint != wb.Addr {
				t.Fatalf("agent on %s, want daemon B %s", s.Endpoint, wb.Addr)
			}
		})
	}
}

// TestOfferOnStaleDaemonDeliveredAtResync: daemon A still holds an old
// transport of the agent session (it has not noticed that the agent moved
// to daemon B) and offers a lease there. B, which holds the agent's
// current transport, delivers it at the agent's next registration and
// resync — with the same MessageId as A's offer — and the answer given
// through B settles A's OfferLease: accepted → success, rejected →
// *RejectedError, revoked unanswered → ErrLeaseRevoked.
func TestOfferOnStaleDaemonDeliveredAtResync(t *testing.T) {
	for _, answer := range []string{"accept", "reject", "revoke"} {
		t.Run(answer, func(t *testing.T) {
			b := enginetest.MemoryBackend()
			pki := trusttest.NewPKI(t)
			auth, _ := sharedAuthorities[0].open(t)
			wa := enginetest.NewWorldWith(t, b, pki, auth, slowHeartbeat, func(c *daemon.Config) { c.ID = "daemon-a" })
			wb := enginetest.NewWorldWith(t, b, pki, auth, slowHeartbeat, func(c *daemon.Config) { c.ID = "daemon-b" })
			id := wa.NewIdentity()
			sess := wire.NewAgentSessionId()
			stale := wa.DialRaw(id)
			stale.Join(sess) // epoch 1 on A
			cur := wb.DialRaw(id)
			cur.Join(sess) // epoch 2 on B: the agent moved, A has not noticed
			if cur.Epoch <= stale.Epoch {
				t.Fatalf("epochs A %d, B %d", stale.Epoch, cur.Epoch)
			}

			o := enginetest.Offer(2)
			o.TTL = 30 * time.Second
			res := make(chan offerResult, 1)
			go func() {
				l, err := wa.D.OfferLease(context.Background(), id.Runner, o)
				res <- offerResult{l, err}
			}()
			offA, envA := enginetest.Next[*agentwire.LeaseOfferV1](t, stale) // lost with the stale transport
			if envA.MessageID != daemon.OfferMessageID(offA.Lease) {
				t.Fatalf("A's offer MessageId %s, want the lease's offer id %s", envA.MessageID, daemon.OfferMessageID(offA.Lease))
			}

			// The agent reconnects to B: registration and resync there.
			next3 := wb.DialRaw(id)
			next3.Join(sess)
			offB, envB := enginetest.Next[*agentwire.LeaseOfferV1](t, next3)
			if offB.Lease != offA.Lease || offB.Attempt != offA.Attempt || offB.Job != offA.Job || offB.SpecID != offA.SpecID ||
				offB.ExpiresAtMs != offA.ExpiresAtMs || offB.Session != sess {
				t.Fatalf("B's offer %+v differs from A's %+v", offB, offA)
			}
			if offB.Epoch != next3.Epoch {
				t.Fatalf("B's offer carries epoch %d, want the new transport's %d", offB.Epoch, next3.Epoch)
			}
			if envB.MessageID != envA.MessageID {
				t.Fatalf("B re-sent with MessageId %s, A sent %s; want one MessageId per lease", envB.MessageID, envA.MessageID)
			}

			switch answer {
			case "accept":
				if err := next3.Ch.Reply(envB, &agentwire.LeaseAcceptedV1{Lease: offB.Lease, Attempt: offB.Attempt, Session: sess}); err != nil {
					t.Fatal(err)
				}
			case "reject":
				if err := next3.Ch.Reply(envB, &agentwire.LeaseRejectedV1{Lease: offB.Lease, Attempt: offB.Attempt, Reason: agentwire.RejectAtCapacity}); err != nil {
					t.Fatal(err)
				}
			case "revoke":
				if err := wb.D.DisableRunner(context.Background(), id.Runner, "operator"); err != nil {
					t.Fatal(err)
				}
			}
			var r offerResult
			select {
			case r = <-res:
			case <-time.After(10 * time.Second):
				t.Fatal("daemon A's OfferLease did not return after the answer through daemon B")
			}
			switch answer {
			case "accept":
				if r.err != nil || r.l.State != authority.LeaseAccepted || r.l.ID != offA.Lease {
					t.Fatalf("OfferLease = %s %q, %v; want %s accepted", r.l.ID, r.l.State, r.err, offA.Lease)
				}
				compl := &agentwire.AttemptCompletionV1{Job: offB.Job, Attempt: offB.Attempt, Lease: offB.Lease, Spec: offB.SpecID,
					Result: agentwire.ExecutionResultV1{Kind: agentwire.ResultSucceeded}}
				env, err := next3.Call(compl)
				if err != nil {
					t.Fatal(err)
				}
				if ack, ok := env.Payload.(*agentwire.CompletionAckV1); !ok || ack.Kind != agentwire.AckAccepted {
					t.Fatalf("completion answered %#v", env.Payload)
				}
				if n, _ := auth.Completions(context.Background(), offB.Attempt); n != 1 {
					t.Fatalf("completions %d", n)
				}
			case "reject":
				var re *daemon.RejectedError
				if !errors.As(r.err, &re) || r.l.State != authority.LeaseRejected {
					t.Fatalf("OfferLease = %q, %v; want a *RejectedError", r.l.State, r.err)
				}
			case "revoke":
				if !errors.Is(r.err, daemon.ErrLeaseRevoked) {
					t.Fatalf("OfferLease = %v, want ErrLeaseRevoked", r.err)
				}
			}
			if st := wa.D.Stats(); st.OffersSettledElsewhere != 1 {
				t.Fatalf("daemon A settled %d offers from the authority, want 1", st.OffersSettledElsewhere)
			}
			if st := wb.D.Stats(); st.OffersAdopted != 1 {
				t.Fatalf("daemon B adopted %d offers, want 1", st.OffersAdopted)
			}
		})
	}
}
