package daemon_test

import (
	"context"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// stuckRenewals is an authority whose RenewLease blocks until gate is
// closed (or the call's context ends), signalling hit on each call.
type stuckRenewals struct {
	authority.Authority
	gate chan struct{}
	hit  chan struct{}
}

func (s *stuckRenewals) RenewLease(ctx context.Context, msg wire.MessageId, id wire.LeaseId, attempt wire.JobAttemptId, ref authority.SessionRef, now time.Time) (authority.RenewResult, error) {
	select {
	case s.hit <- struct{}{}:
	default:
	}
	select {
	case <-s.gate:
	case <-ctx.Done():
		return authority.RenewResult{}, ctx.Err()
	}
	return s.Authority.RenewLease(ctx, msg, id, attempt, ref, now)
}

// TestHeartbeatNotBehindAuthority: while every lease renewal is stuck in
// the authority (each holds its handler for the 500 ms request timeout,
// renewals arrive every 50 ms), the daemon keeps answering heartbeats
// (100 ms interval) and does not close the transport for "no heartbeat for
// 3 intervals". With authority-bound messages handled on the control
// stream's read goroutine, the first stuck renewal held every later
// heartbeat back past the 300 ms liveness limit.
func TestHeartbeatNotBehindAuthority(t *testing.T) {
	auth, err := authority.OpenSQLite(context.Background(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = auth.Close() })
	stuck := &stuckRenewals{Authority: auth, gate: make(chan struct{}), hit: make(chan struct{}, 1)}
	w := enginetest.NewWorldWith(t, enginetest.MemoryBackend(), trusttest.NewPKI(t), stuck)
	id := w.NewIdentity()
	exec := enginetest.NewCountingExec(true)
	a, _, _ := w.StartAgent(id, exec)
	w.AwaitActive(id.Runner)
	go func() { _, _ = w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(1)) }()
	enginetest.AwaitStart(t, exec) // renewals start with the attempt
	select {
	case <-stuck.hit:
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal reached the authority")
	}
	// 1.2 s of stuck renewals: at least 6 more heartbeat acks must arrive
	// (12 intervals; the bound leaves room for a loaded -race machine).
	last, acks := a.Status().LastHeartbeatAck, 0
	end := time.Now().Add(1200 * time.Millisecond)
	for time.Now().Before(end) {
		time.Sleep(5 * time.Millisecond) // polling: no event for "ack received"
		if cur := a.Status().LastHeartbeatAck; cur.After(last) {
			last, acks = cur, acks+1
		}
	}
	close(stuck.gate)
	if acks < 6 {
		t.Errorf("%d heartbeat acks in 1.2 s while renewals were stuck in the authority (interval 100 ms)", acks)
	}
	if r := a.Stats().Reconnects; r != 0 {
		t.Errorf("%d reconnects while renewals were stuck in the authority", r)
	}
	close(exec.Release)
}
