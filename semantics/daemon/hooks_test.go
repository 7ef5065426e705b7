package daemon_test

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// TestHookOnCapabilities: an accepted registration reports the runner's
// declared capabilities to Hooks.OnCapabilities with its session.
func TestHookOnCapabilities(t *testing.T) {
	type capEvent struct {
		s daemon.SessionInfo
		c agentwire.RunnerCapabilitiesV1
	}
	caps := make(chan capEvent, 16)
	w := enginetest.NewWorld(t, enginetest.MemoryBackend(), func(c *daemon.Config) {
		c.Hooks.OnCapabilities = func(s daemon.SessionInfo, c agentwire.RunnerCapabilitiesV1) { caps <- capEvent{s, c} }
	})
	id := w.NewIdentity()
	want := agentwire.RunnerCapabilitiesV1{OS: "linux", Arch: "amd64", Labels: []string{"gpu"}, MaxParallel: 3}
	w.StartAgent(id, enginetest.NewCountingExec(false), func(c *agent.Config) { c.Capabilities = want })
	select {
	case ev := <-caps:
		if ev.s.Runner != id.Runner {
			t.Fatalf("runner %v, want %v", ev.s.Runner, id.Runner)
		}
		if ev.c.OS != want.OS || ev.c.Arch != want.Arch || len(ev.c.Labels) != 1 || ev.c.Labels[0] != "gpu" || ev.c.MaxParallel != want.MaxParallel {
			t.Fatalf("capabilities %+v, want %+v", ev.c, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("OnCapabilities not called")
	}
}

// TestHookOnOutputs: the outputs an agent declares for its attempt, after
// uploading them to the daemon's content store, reach Hooks.OnOutputs.
func TestHookOnOutputs(t *testing.T) {
	const size = 4 << 10
	outs := make(chan daemon.OutputsEvent, 16)
	w, _, store := enginetest.DataWorld(t, enginetest.MemoryBackend(), func(c *daemon.Config) {
		c.Hooks.OnOutputs = func(ev daemon.OutputsEvent) { outs <- ev }
	})
	id := w.NewIdentity()
	exec := agent.NewSyntheticExecutor(1, agent.SyntheticOptions{LogLines: 2, OutputSize: size})
	w.StartAgent(id, exec, enginetest.SpoolIn(t.TempDir()))
	w.AwaitActive(id.Runner)
	o := enginetest.Offer(3)
	l, err := w.D.OfferLease(context.Background(), id.Runner, o)
	if err != nil {
		t.Fatal(err)
	}
	blob := agent.SyntheticOutput(o.Spec, size)
	ref := wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: sha256.Sum256(blob), Size: size}
	select {
	case ev := <-outs:
		if ev.Runner != id.Runner || ev.Attempt != l.Attempt || ev.Lease != l.ID || len(ev.Outputs) != 1 || ev.Outputs[0] != ref {
			t.Fatalf("event %+v, want attempt %v lease %v output %v", ev, l.Attempt, l.ID, ref)
		}
		if st, err := store.Stat(ref); err != nil || !st.Complete {
			t.Fatalf("declared output not in the content store: %+v %v", st, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("OnOutputs not called")
	}
	w.AwaitCompletion(l.Attempt, agentwire.AckAccepted)
}
