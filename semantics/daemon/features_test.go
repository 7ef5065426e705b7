package daemon_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// TestLogCompressionNegotiated: protocol 1.1's LogCompressionV1. The
// session records the negotiated features (daemon's ∩ agent's), and the
// agent's log streams are Flate only when the feature was negotiated, Raw
// otherwise (the 1.0 fallback a 1.1 agent uses with a daemon that does
// not offer it); the stored log is the same either way.
func TestLogCompressionNegotiated(t *testing.T) {
	base := wire.Features(wire.FeatureLogResumeV1, wire.FeatureCasRangeResumeV1)
	full := base.With(wire.FeatureLogCompressionV1)
	for _, c := range []struct {
		name          string
		daemon, agent wire.FeatureSet
		want          wlogs.LogEncoding
	}{
		{"both", full, full, wlogs.LogEncodingFlate},
		{"daemon-without", base, full, wlogs.LogEncodingRaw},
		{"agent-without", full, base, wlogs.LogEncodingRaw},
	} {
		t.Run(c.name, func(t *testing.T) {
			encs := make(chan wlogs.LogStreamHeaderV1, 16)
			w, sink, _ := enginetest.DataWorld(t, enginetest.MemoryBackend(), func(cfg *daemon.Config) {
				cfg.Features = c.daemon
				cfg.Hooks.OnLogStream = func(h wlogs.LogStreamHeaderV1) { encs <- h }
			})
			id := w.NewIdentity()
			const lines = 50
			exec := agent.NewSyntheticExecutor(1, agent.SyntheticOptions{LogLines: lines, OutputSize: -1})
			w.StartAgent(id, exec, enginetest.SpoolIn(t.TempDir()), func(cfg *agent.Config) { cfg.Features = c.agent })
			s := w.AwaitRegistered(id.Runner)
			if want := c.daemon.Intersect(c.agent); s.Features != want {
				t.Fatalf("session features %v, want %v", s.Features, want)
			}
			w.AwaitActive(id.Runner)
			o := enginetest.Offer(3)
			l, err := w.D.OfferLease(context.Background(), id.Runner, o)
			if err != nil {
				t.Fatal(err)
			}
			w.AwaitCompletion(l.Attempt, agentwire.AckAccepted)
			select {
			case h := <-encs:
				if h.Attempt != l.Attempt || h.Encoding != c.want {
					t.Fatalf("log stream of %v encoded %v, want %v", h.Attempt, h.Encoding, c.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("no log stream header observed")
			}
			var want strings.Builder
			for i := 0; i < lines; i++ {
				want.WriteString(agent.SyntheticLogLine(o.Spec, i))
			}
			if got := enginetest.Stdout(t, sink, l.Attempt); got != want.String() {
				t.Fatalf("stored log differs: %d bytes, want %d", len(got), want.Len())
			}
		})
	}
}
