package daemon_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/daemon"
	agentwire "forgeyard.dev/transport/wire/agent"
)

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}

// TestLatencyFigures runs 30 sequential lease lifecycles per backend and
// reports offer→accept and completion→ack latencies (daemon side) and the
// cancel delivery latency. It asserts only that every sample exists.
func TestLatencyFigures(t *testing.T) {
	const n = 30
	backends(t, func(t *testing.T, b backend) {
		w := newWorld(t, b)
		id := w.newIdentity()
		w.startAgent(id, newCountingExec(false))
		w.awaitActive(id.runner)
		ctx := context.Background()
		for i := 0; i < n; i++ {
			l, err := w.d.OfferLease(ctx, id.runner, offer(i))
			if err != nil {
				t.Fatal(err)
			}
			w.awaitCompletion(l.Attempt, agentwire.AckAccepted)
		}
		deadline := time.Now().Add(5 * time.Second)
		for len(w.d.Stats().CompletionToAck) < n && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond) // the sample is taken after the ack is written
		}
		st := w.d.Stats()
		if len(st.OfferToAccept) != n || len(st.CompletionToAck) != n {
			t.Fatalf("samples: %d offer, %d completion", len(st.OfferToAccept), len(st.CompletionToAck))
		}
		t.Logf("%s: offer→accept p50 %v p99 %v; completion→ack (daemon) p50 %v p99 %v",
			b.name, pct(st.OfferToAccept, 50), pct(st.OfferToAccept, 99), pct(st.CompletionToAck, 50), pct(st.CompletionToAck, 99))
	})
}

// TestDedupPruned: the maintenance loop prunes dedup records older than
// Config.DedupRetention.
func TestDedupPruned(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		w := newWorld(t, b, func(c *daemon.Config) { c.DedupRetention = time.Millisecond })
		id := w.newIdentity()
		w.startAgent(id, newCountingExec(false))
		w.awaitActive(id.runner)
		l, err := w.d.OfferLease(context.Background(), id.runner, offer(1))
		if err != nil {
			t.Fatal(err)
		}
		w.awaitCompletion(l.Attempt, agentwire.AckAccepted) // writes a dedup record
		deadline := time.Now().Add(5 * time.Second)
		for w.d.Stats().DedupPruned == 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // the loop runs every RenewInterval; no event
		}
		if w.d.Stats().DedupPruned == 0 {
			t.Fatal("no dedup record pruned")
		}
	})
}
