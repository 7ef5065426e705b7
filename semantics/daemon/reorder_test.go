package daemon_test

import (
	"context"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// TestDuplicateCancel (§174): a cancel delivered several times — two
// CancelAttempt calls, concurrent ones, and the same CancelAttemptV1
// re-sent after the attempt ended — stops the attempt once: one
// execution, one cancellation counted by the agent, one Cancelled
// completion recorded, and every copy answered.
func TestDuplicateCancel(t *testing.T) {
	enginetest.AllBackends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		exec := enginetest.NewCountingExec(true)
		done := make(chan agent.AttemptDone, 4)
		a, _, _ := w.StartAgent(id, exec, func(c *agent.Config) { c.Hooks.OnAttemptDone = func(d agent.AttemptDone) { done <- d } })
		w.AwaitActive(id.Runner)
		offered := make(chan error, 1)
		go func() {
			_, err := w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(40))
			offered <- err
		}()
		job := enginetest.AwaitStart(t, exec)
		// The executor may start before the daemon's authority recorded
		// the acceptance (group commit): cancel once OfferLease returned.
		if err := <-offered; err != nil {
			t.Fatalf("OfferLease: %v", err)
		}
		ctx := context.Background()
		errs := make(chan error, 3)
		for range 3 {
			go func() { errs <- w.D.CancelAttempt(ctx, job.Attempt, agentwire.CancelUserRequested) }()
		}
		for range 3 {
			if err := <-errs; err != nil {
				t.Fatalf("CancelAttempt: %v", err)
			}
		}
		select {
		case d := <-done:
			if d.Result.Kind != agentwire.ResultCancelled || d.Ack != agentwire.AckAccepted {
				t.Fatalf("done %+v", d)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("cancelled attempt never completed")
		}
		// After the end: a cancel again (the authority still knows the
		// attempt's lease, now completed) and the same wire message again.
		_ = w.D.CancelAttempt(ctx, job.Attempt, agentwire.CancelUserRequested)
		if err := daemon.SendToRunner(w.D, id.Runner, &agentwire.CancelAttemptV1{Attempt: job.Attempt, Lease: job.Lease, Reason: agentwire.CancelUserRequested}); err != nil {
			t.Fatal(err)
		}
		if n := exec.Count(job.Attempt); n != 1 {
			t.Errorf("attempt executed %d times", n)
		}
		if n, err := w.Auth.Completions(ctx, job.Attempt); err != nil || n != 1 {
			t.Errorf("completions recorded %d (%v), want 1", n, err)
		}
		if n := a.Stats().Cancels; n != 1 {
			t.Errorf("agent counted %d cancellations, want 1", n)
		}
		select {
		case d := <-done:
			t.Errorf("a second completion was acknowledged: %+v", d)
		default:
		}
	})
}

// TestReorderedControlMessages (§175): the control semantics of one
// attempt hold whatever order its messages arrive in. A raw agent answers
// an offer in the worst order — the completion first, then a phase
// report, a renewal, the acceptance, and the completion again — and the
// daemon records exactly one completion, never extends or revives the
// finished lease, and answers the repeated completion as a duplicate.
func TestReorderedControlMessages(t *testing.T) {
	enginetest.AllBackends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b, slowHeartbeat) // the raw agent sends no heartbeats
		id := w.NewIdentity()
		rc := w.DialRaw(id)
		rc.Join(wire.NewAgentSessionId())
		w.AwaitActive(id.Runner)
		ctx := context.Background()
		go func() { _, _ = w.D.OfferLease(ctx, id.Runner, enginetest.Offer(41)) }()
		off, _ := enginetest.Next[*agentwire.LeaseOfferV1](t, rc)

		compl := &agentwire.AttemptCompletionV1{Job: off.Job, Attempt: off.Attempt, Lease: off.Lease, Spec: off.SpecID,
			Result: agentwire.ExecutionResultV1{Kind: agentwire.ResultSucceeded}}
		complID := wire.NewMessageId()
		call := func(o control.Out) *wire.Envelope {
			t.Helper()
			env, err := rc.Ch.Call(ctx, o, 2*time.Second)
			if err != nil {
				t.Fatalf("%T: %v", o.Msg, err)
			}
			return env
		}
		first, ok := call(control.Out{ID: complID, Msg: compl}).Payload.(*agentwire.CompletionAckV1)
		if !ok {
			t.Fatal("completion not acknowledged")
		}
		if _, err := rc.Ch.SendMsg(&agentwire.PhaseChangeV1{Attempt: off.Attempt, Lease: off.Lease, Phase: agentwire.PhaseRunning, AtMs: 1}); err != nil {
			t.Fatal(err)
		}
		renew, ok := call(control.Out{Msg: &agentwire.LeaseRenewV1{Lease: off.Lease, Attempt: off.Attempt, ObservedPhase: agentwire.PhaseRunning}}).Payload.(*agentwire.LeaseRenewAckV1)
		if !ok {
			t.Fatal("renewal not answered with LeaseRenewAckV1")
		}
		if renew.Outcome.Kind == agentwire.RenewExtended {
			t.Errorf("a renewal after the completion extended the lease: %+v", renew.Outcome)
		}
		// The late acceptance: whether or not it is answered (the offer
		// is settled, so the daemon may stay silent), it must not revive.
		_, _ = rc.Ch.Call(ctx, control.Out{Msg: &agentwire.LeaseAcceptedV1{Lease: off.Lease, Attempt: off.Attempt, Session: rc.Sess}}, 500*time.Millisecond)
		again, ok := call(control.Out{ID: complID, Msg: compl}).Payload.(*agentwire.CompletionAckV1)
		if !ok {
			t.Fatal("repeated completion not acknowledged")
		}
		// The offered lease is live: a completion before the acceptance
		// counts (the agent ran the attempt), exactly once.
		if first.Kind != agentwire.AckAccepted {
			t.Errorf("first completion answered %s, want Accepted", first.Kind)
		}
		if again.Kind != agentwire.AckDuplicateAccepted {
			t.Errorf("repeated completion answered %s, want DuplicateAccepted", again.Kind)
		}
		l, err := w.Auth.Lease(ctx, off.Lease)
		if err != nil {
			t.Fatal(err)
		}
		if l.State.Live() {
			t.Errorf("lease is %s after its completion and a late acceptance", l.State)
		}
		n, err := w.Auth.Completions(ctx, off.Attempt)
		if err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("%d completions recorded, want 1", n)
		}
		t.Logf("%s: completion before acceptance answered %s, repeat %s; renewal after it %s; lease %s", b.Name, first.Kind, again.Kind, renew.Outcome.Kind, l.State)
	})
}
