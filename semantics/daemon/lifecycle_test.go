package daemon_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// TestLeaseLifecycle: offer → accept → run → completion Accepted, exactly
// once in the authority, on every backend.
func TestLeaseLifecycle(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		exec := enginetest.NewCountingExec(false)
		a, _, _ := w.StartAgent(id, exec)
		w.AwaitActive(id.Runner)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l, err := w.D.OfferLease(ctx, id.Runner, enginetest.Offer(1))
		if err != nil {
			t.Fatalf("OfferLease: %v", err)
		}
		if l.Session != a.Session() {
			t.Fatalf("lease bound to %s, agent session %s", l.Session, a.Session())
		}
		w.AwaitCompletion(l.Attempt, agentwire.AckAccepted)
		if n, _ := w.Auth.Completions(ctx, l.Attempt); n != 1 {
			t.Fatalf("completions in authority = %d, want 1", n)
		}
		if exec.Count(l.Attempt) != 1 {
			t.Fatalf("executor ran %d times", exec.Count(l.Attempt))
		}
		st := w.D.Stats()
		if st.LeasesOffered != 1 || st.LeasesAccepted != 1 || st.Completions[agentwire.AckAccepted] != 1 {
			t.Fatalf("stats %+v", st)
		}
		if s := enginetest.AwaitConnected(t, a); !s.Connected || s.Backend != b.Name || s.Epoch < 1 {
			t.Fatalf("agent status %+v", s)
		}
	})
}

// TestNegotiatesHighestVersion: the highest version in both ranges wins.
func TestNegotiatesHighestVersion(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b, func(c *daemon.Config) {
			c.Protocol = wire.ProtocolRange{Min: wire.V(1, 0), Max: wire.V(1, 5)}
			c.Features = wire.Features(wire.FeatureLogResumeV1, wire.FeatureSigningV1)
		})
		id := w.NewIdentity()
		a, _, _ := w.StartAgent(id, enginetest.NewCountingExec(false), func(c *agent.Config) {
			c.Protocol = wire.ProtocolRange{Min: wire.V(1, 0), Max: wire.V(1, 3)}
			c.Features = wire.Features(wire.FeatureLogResumeV1, wire.FeatureDeviceControlV1)
		})
		s := w.AwaitRegistered(id.Runner)
		if s.Protocol != wire.V(1, 3) {
			t.Fatalf("daemon negotiated %s, want 1.3", s.Protocol)
		}
		w.AwaitActive(id.Runner)
		st := enginetest.AwaitConnected(t, a)
		if st.Protocol != wire.V(1, 3) {
			t.Fatalf("agent negotiated %s, want 1.3", st.Protocol)
		}
		if st.Features != wire.Features(wire.FeatureLogResumeV1) {
			t.Fatalf("features %s, want the intersection {LogResumeV1}", st.Features)
		}
	})
}

// TestPolicyMinimumRejected: a common version below Config.MinProtocol is
// refused like a mismatch (downgrade defence §274).
func TestPolicyMinimumRejected(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b, func(c *daemon.Config) {
			c.Protocol = wire.ProtocolRange{Min: wire.V(1, 0), Max: wire.V(1, 5)}
			c.MinProtocol = wire.V(1, 4)
		})
		id := w.NewIdentity()
		_, _, runErr := w.StartAgent(id, enginetest.NewCountingExec(false), func(c *agent.Config) {
			c.Protocol = wire.ProtocolRange{Min: wire.V(1, 0), Max: wire.V(1, 2)}
		})
		select {
		case err := <-runErr:
			if !strings.Contains(err.Error(), "server supports 1.4–1.5, agent supports 1.0–1.2") {
				t.Fatalf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return")
		}
	})
}

// TestInvalidOfferRefusedLocally: an offer the agent would reject as
// invalid is refused by OfferLease before anything is recorded.
func TestInvalidOfferRefusedLocally(t *testing.T) {
	w := enginetest.NewWorld(t, enginetest.MemoryBackend())
	id := w.NewIdentity()
	w.StartAgent(id, enginetest.NewCountingExec(false))
	w.AwaitActive(id.Runner)
	o := enginetest.Offer(1)
	o.Payload = wire.CasObjectRef{}
	if _, err := w.D.OfferLease(context.Background(), id.Runner, o); err == nil || !strings.Contains(err.Error(), "invalid lease offer") {
		t.Fatalf("OfferLease: %v", err)
	}
	if _, err := w.D.OfferLease(context.Background(), wire.NewRunnerId(), enginetest.Offer(2)); !errors.Is(err, daemon.ErrNotConnected) {
		t.Fatalf("unknown runner: %v", err)
	}
	if w.D.Stats().LeasesOffered != 0 {
		t.Fatal("invalid offer recorded")
	}
}

func TestConfigValidation(t *testing.T) {
	auth, err := authority.OpenSQLite(context.Background(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer auth.Close()
	for name, cfg := range map[string]daemon.Config{
		"no authority":   {},
		"bad range":      {Authority: auth, Protocol: wire.ProtocolRange{Min: wire.V(2, 0), Max: wire.V(1, 0)}},
		"min above max":  {Authority: auth, Protocol: wire.ProtocolRange{Min: wire.V(1, 0), Max: wire.V(1, 2)}, MinProtocol: wire.V(1, 3)},
		"empty endpoint": {Authority: auth, AlternateEndpoints: []string{""}},
		"dup endpoint":   {Authority: auth, AlternateEndpoints: []string{"a:1", "a:1"}},
		"stagger":        {Authority: auth, Timing: daemon.Timing{FallbackStagger: make([]time.Duration, 9)}},
	} {
		if d, err := daemon.New(cfg); err == nil {
			_ = d.Shutdown(context.Background())
			t.Errorf("%s: accepted", name)
		}
	}
	d, err := daemon.New(daemon.Config{Authority: auth, MinProtocol: wire.V(1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	if tm := d.Timing(); tm.HeartbeatInterval != daemon.DefaultHeartbeatInterval || tm.LeaseTTL != daemon.DefaultLeaseTTL {
		t.Fatalf("defaults not applied: %+v", tm)
	}
	_ = d.Shutdown(context.Background())
}

// TestPhaseReported: a phase sent best effort, or only re-asserted in a
// heartbeat, reaches Hooks.OnPhase once per change.
func TestPhaseReported(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		phases := make(chan daemon.PhaseEvent, 16)
		w := enginetest.NewWorld(t, b, slowHeartbeat, func(c *daemon.Config) {
			c.Hooks.OnPhase = func(p daemon.PhaseEvent) { phases <- p }
		})
		id := w.NewIdentity()
		sess := wire.NewAgentSessionId()
		rc := w.DialRaw(id)
		rc.Join(sess)
		att, lease := wire.NewJobAttemptId(), wire.NewLeaseId()
		if _, err := rc.Ch.SendMsg(&agentwire.PhaseChangeV1{Attempt: att, Lease: lease, Phase: agentwire.PhasePreparing, AtMs: 1}); err != nil {
			t.Fatal(err)
		}
		hb := func(seq uint64, p agentwire.AttemptPhase) {
			_, err := rc.Call(&agentwire.HeartbeatV1{Runner: id.Runner, Session: sess, Seq: seq, CapabilityDigest: wire.CapabilityDigest{Digest: wire.Digest{9}},
				ActiveAttempts: []agentwire.ActiveAttemptV1{{Attempt: att, Lease: lease, Phase: p}}})
			if err != nil {
				t.Fatal(err)
			}
		}
		hb(1, agentwire.PhasePreparing) // same phase: not reported again
		hb(2, agentwire.PhaseRunning)   // the PhaseChangeV1 for Running was "lost"
		want := []agentwire.AttemptPhase{agentwire.PhasePreparing, agentwire.PhaseRunning}
		for _, p := range want {
			select {
			case ev := <-phases:
				if ev.Phase != p || ev.Attempt != att || ev.Runner != id.Runner {
					t.Fatalf("event %+v, want %s", ev, p)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("no %s event", p)
			}
		}
		select {
		case ev := <-phases:
			t.Fatalf("unexpected event %+v", ev)
		default:
		}
	})
}
