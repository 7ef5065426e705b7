package daemon_test

import (
	"context"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/stats"
	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/daemon"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// TestLatencyFigures runs 30 sequential lease lifecycles per backend and
// reports offer→accept and completion→ack latencies (daemon side) and the
// cancel delivery latency. It asserts only that every lifecycle has its samples.
func TestLatencyFigures(t *testing.T) {
	const n = 30
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		// A starved test process may miss heartbeats and reconnect: the
		// offers are retried (w.OfferLease) and do not expire meanwhile.
		w := enginetest.NewWorld(t, b, func(c *daemon.Config) { c.Timing.LeaseTTL = time.Minute })
		id := w.NewIdentity()
		a, _, _ := w.StartAgent(id, enginetest.NewCountingExec(false))
		w.AwaitActive(id.Runner)
		ctx := context.Background()
		for i := 0; i < n; i++ {
			l, err := w.OfferLease(ctx, id.Runner, enginetest.Offer(i))
			if err != nil {
				t.Fatal(err)
			}
			w.AwaitCompletion(l.Attempt, agentwire.AckAccepted)
		}
		deadline := time.Now().Add(5 * time.Second)
		for len(w.D.Stats().CompletionToAck) < n && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond) // the sample is taken after the ack is written
		}
		st := w.D.Stats()
		// One sample per lifecycle whose answer came straight back. A
		// completion (or offer) that the agent re-sent after its request
		// timeout on a loaded machine is answered again (DuplicateAccepted)
		// and adds a sample of its own; an offer whose answer crossed a
		// reconnect (a starved process missing heartbeats) is settled from
		// the authority and has none.
		want := n - int(a.Stats().Reconnects)
		if want < n/2 || len(st.OfferToAccept) < want || len(st.CompletionToAck) < want {
			t.Fatalf("samples: %d offer, %d completion, want ≥ %d each (%d reconnects)", len(st.OfferToAccept), len(st.CompletionToAck), want, n-want)
		}
		t.Logf("%s: offer→accept p50 %v p99 %v; completion→ack (daemon) p50 %v p99 %v",
			b.Name, stats.PercentileOf(st.OfferToAccept, 50), stats.PercentileOf(st.OfferToAccept, 99), stats.PercentileOf(st.CompletionToAck, 50), stats.PercentileOf(st.CompletionToAck, 99))
	})
}

// TestDedupPruned: the maintenance loop prunes dedup records older than
// Config.DedupRetention.
func TestDedupPruned(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b, func(c *daemon.Config) { c.DedupRetention = time.Millisecond })
		id := w.NewIdentity()
		w.StartAgent(id, enginetest.NewCountingExec(false))
		w.AwaitActive(id.Runner)
		l, err := w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(1))
		if err != nil {
			t.Fatal(err)
		}
		w.AwaitCompletion(l.Attempt, agentwire.AckAccepted) // writes a dedup record
		deadline := time.Now().Add(5 * time.Second)
		for w.D.Stats().DedupPruned == 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // the loop runs every RenewInterval; no event
		}
		if w.D.Stats().DedupPruned == 0 {
			t.Fatal("no dedup record pruned")
		}
	})
}
