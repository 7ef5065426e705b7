package daemon_test

import (
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// TestHeartbeatBudget: with a budget of 2 heartbeats/s, the n-th session
// to register (itself included) is given clamp(n/2 s, 1 s, 3 s), in
// RegistrationAcceptedV1 and SessionInfo, so the fleet's heartbeat rate
// stays within the budget as it grows.
func TestHeartbeatBudget(t *testing.T) {
	w := enginetest.NewWorld(t, enginetest.MemoryBackend(), func(c *daemon.Config) {
		c.Timing.HeartbeatInterval = time.Second
		c.Timing.MaxHeartbeatsPerSecond = 2
		c.Timing.MaxHeartbeatInterval = 3 * time.Second
	})
	want := []time.Duration{time.Second, time.Second, 1500 * time.Millisecond, 2 * time.Second,
		2500 * time.Millisecond, 3 * time.Second, 3 * time.Second, 3 * time.Second, 3 * time.Second}
	var rate float64
	for k, iv := range want {
		rc := w.DialRaw(w.NewIdentity())
		rc.Hello(agentwire.RoleAgent)
		acc, ok := rc.Register(wire.NewAgentSessionId()).(*agentwire.RegistrationAcceptedV1)
		if !ok {
			t.Fatalf("registration %d refused", k)
		}
		if got := time.Duration(acc.HeartbeatIntervalMs) * time.Millisecond; got != iv {
			t.Fatalf("registration %d: interval %v, want %v", k+1, got, iv)
		}
		rate += 1 / iv.Seconds()
		if c := w.D.Counts(); c.Sessions != k+1 || c.Connections != k+1 {
			t.Fatalf("Counts %+v after %d registrations", c, k+1)
		}
	}
	// 9 sessions heartbeat 4.2 times a second instead of 9.
	if rate > 5 {
		t.Fatalf("fleet heartbeat rate %.2f/s, want ≤ 5/s", rate)
	}
	for _, s := range w.D.Sessions() {
		if s.HeartbeatInterval < time.Second || s.HeartbeatInterval > 3*time.Second {
			t.Fatalf("SessionInfo.HeartbeatInterval %v outside the clamp", s.HeartbeatInterval)
		}
	}
}

// TestConnectionCap: with MaxConnections 2, a third transport is refused —
// by AdmitEarly (what a QUIC listener asks before its handshake) and, on a
// listener that cannot ask, at connect with CloseOverloaded — and counted;
// a freed slot admits again.
func TestConnectionCap(t *testing.T) {
	w := enginetest.NewWorld(t, enginetest.MemoryBackend(), slowHeartbeat, func(c *daemon.Config) {
		c.Bounds.Admission.MaxConnections = 2
	})
	first := w.DialRaw(w.NewIdentity())
	first.Join(wire.NewAgentSessionId())
	w.DialRaw(w.NewIdentity()).Join(wire.NewAgentSessionId())
	if err := w.D.AdmitEarly(nil); err == nil {
		t.Fatal("AdmitEarly admitted a third connection over MaxConnections 2")
	}
	over := dialRawNoStream(w, w.NewIdentity())
	if code := over.CloseCode(); code != wire.CloseOverloaded {
		t.Fatalf("third connection closed with %s, want Overloaded", code)
	}
	st := w.D.HardeningStats()
	if st.RefusedEarly != 1 || st.RefusedConns != 1 {
		t.Fatalf("stats %+v, want 1 early and 1 connect refusal", st)
	}
	_ = first.Bc.CloseWithCode(wire.CloseNormal, "")
	awaitCounts(t, w.D, 1)
	if err := w.D.AdmitEarly(nil); err != nil {
		t.Fatalf("AdmitEarly after a connection left: %v", err)
	}
	w.DialRaw(w.NewIdentity()).Join(wire.NewAgentSessionId())
}

// TestFDHeadroom: while Config.OpenFiles reports fewer free descriptors than
// Admission.FDHeadroom, hellos are answered Overloaded with a retry class
// and connections refused, before accept would fail with EMFILE.
func TestFDHeadroom(t *testing.T) {
	var open atomic.Int64
	w := enginetest.NewWorld(t, enginetest.MemoryBackend(), slowHeartbeat, func(c *daemon.Config) {
		c.Bounds.Admission.FDHeadroom = 10
		c.OpenFiles = func() (int, int) { return int(open.Load()), 100 }
	})
	open.Store(50)
	rc := w.DialRaw(w.NewIdentity())
	awaitCounts(t, w.D, 1) // admitted at connect
	open.Store(95)         // as if a burst of log files took the descriptors
	env, err := rc.Call(&agentwire.TransportHelloV1{Role: agentwire.RoleAgent, Versions: wire.Supported, AgentVersion: "raw"})
	if err != nil {
		t.Fatal(err)
	}
	rj, ok := env.Payload.(*agentwire.RegistrationRejectedV1)
	if !ok || rj.Code != wire.ErrCodeOverloaded || rj.Retry != wire.RetryBackoff {
		t.Fatalf("hello at the headroom answered %#v, want Overloaded with RetryBackoff", env.Payload)
	}
	if code := rc.CloseCode(); code != wire.CloseOverloaded {
		t.Fatalf("closed with %s, want Overloaded", code)
	}
	if err := w.D.AdmitEarly(nil); err == nil {
		t.Fatal("AdmitEarly admitted at the descriptor headroom")
	}
	open.Store(50)
	w.DialRaw(w.NewIdentity()).Join(wire.NewAgentSessionId())
}

// awaitCounts waits until d has n connections (teardown is asynchronous).
func awaitCounts(t *testing.T, d *daemon.Daemon, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); d.Counts().Connections != n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("connections %d, want %d", d.Counts().Connections, n)
		}
	}
}
