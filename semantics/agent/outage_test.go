package agent_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// gateDialer refuses every dial while closed (the daemon unreachable).
type gateDialer struct {
	inner  semantics.BackendDialer
	closed atomic.Bool
}

func (g *gateDialer) Dial(ctx context.Context, addr string) (semantics.BackendConn, error) {
	if g.closed.Load() {
		return nil, errors.New("test outage: daemon unreachable")
	}
	return g.inner.Dial(ctx, addr)
}

// TestDataSurvivesOutageLongerThanBudget (found by the fault-injection
// soak, issue 15 item 6): the daemon becomes unreachable right after the
// executor wrote its log and stored its output, for longer than the
// agent's data budget (max(4×RequestTimeout, 5 s)), while the lease stays
// live. The agent keeps the log spooled and the output stored, retries
// the logs-finalized barrier and the upload on the next link, and the
// completion claims the output: the daemon holds every log line and the
// object. Before the fix the barrier and the upload were given up after
// one budget: the completion went out with a truncated log (the spooled
// log was deleted) and without the output.
func TestDataSurvivesOutageLongerThanBudget(t *testing.T) {
	const lines = 30
	w, sink, store := enginetest.DataWorld(t, enginetest.MemoryBackend(), func(c *daemon.Config) { c.Timing.LeaseTTL = time.Minute })
	id := w.NewIdentity()
	line := func(i int) string { return fmt.Sprintf("outage line %02d %s\n", i, strings.Repeat("o", 30)) }
	blob := []byte(strings.Repeat("output that must reach the daemon\n", 100))
	var gate *gateDialer
	var rd *enginetest.RecDialer
	offered := make(chan struct{})
	exec := agent.ExecutorFunc(func(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
		for i := 0; i < lines; i++ {
			if err := out.Log(wlogs.LogStdout, []byte(line(i))); err != nil {
				return agent.Result{Kind: agentwire.ResultInfraError, Message: err.Error()}
			}
		}
		if _, err := out.PutOutput(blob); err != nil {
			return agent.Result{Kind: agentwire.ResultInfraError, Message: err.Error()}
		}
		// The outage starts as the executor returns, once the daemon has
		// the lease's acceptance (cut before it arrived, the offer
		// expires unanswered: a different test).
		select {
		case <-offered:
		case <-ctx.Done():
			return agent.Result{Kind: agentwire.ResultInfraError, Message: "cancelled"}
		}
		gate.closed.Store(true)
		rd.Cut()
		return agent.Result{Kind: agentwire.ResultSucceeded}
	})
	a, rd0, _ := w.StartAgent(id, exec, enginetest.SpoolIn(t.TempDir()), func(c *agent.Config) {
		gate = &gateDialer{inner: c.Endpoints[0].Dialer}
		c.Endpoints[0].Dialer = gate
	})
	rd = rd0
	w.AwaitActive(id.Runner)
	l, err := w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(77))
	if err != nil {
		t.Fatal(err)
	}
	close(offered)
	// The outage lasts until the agent has given its first barrier or
	// upload budget up (a retry is counted), then the daemon is back.
	deadline := time.Now().Add(30 * time.Second)
	for st := a.Stats(); st.LogStorageRetries+st.OutputsStorageRetries == 0; st = a.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("the agent never retried its log barrier or upload after the budget; stats %+v", st)
		}
		time.Sleep(20 * time.Millisecond) // a counter, no event to await
	}
	gate.closed.Store(false)
	ev := w.AwaitCompletion(l.Attempt, agentwire.AckAccepted)
	if ev.Result.Kind != agentwire.ResultSucceeded {
		t.Fatalf("result %v", ev.Result)
	}
	var want strings.Builder
	for i := 0; i < lines; i++ {
		want.WriteString(line(i))
	}
	if got := enginetest.Stdout(t, sink, l.Attempt); got != want.String() {
		t.Fatalf("daemon holds %d log bytes, want %d: the completion went out with a truncated log", len(got), want.Len())
	}
	ref := wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: sha256.Sum256(blob), Size: uint64(len(blob))}
	if st, err := store.Stat(ref); err != nil || !st.Complete {
		t.Fatalf("output not in the daemon's store after the outage: %+v %v", st, err)
	}
	if outs, ok := w.D.FinalizedOutputs(l.Attempt); !ok || len(outs) != 1 || outs[0] != ref {
		t.Fatalf("finalized outputs %v %v, want [%v]", outs, ok, ref)
	}
	if st := a.Stats(); st.OutputsFailed != 0 || st.LogFinalizeFailed != 0 {
		t.Fatalf("agent gave data up: %+v", st)
	}
}
