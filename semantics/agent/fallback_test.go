package agent

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics"
)

type failDialer struct{ calls atomic.Int64 }

func (f *failDialer) Dial(ctx context.Context, addr string) (semantics.BackendConn, error) {
	f.calls.Add(1)
	return nil, errors.New("refused")
}

func fbAgent(t *testing.T, eps []Endpoint, fb Fallback) *Agent {
	t.Helper()
	c := testConfig(t)
	c.Endpoints, c.Fallback, c.SpoolDir = eps, fb, t.TempDir()
	a, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

func classEndpoints(d semantics.BackendDialer) []Endpoint {
	return []Endpoint{
		{Address: "q1", Dialer: d, Backend: "quic"},
		{Address: "q2", Dialer: d, Backend: "quic"},
		{Address: "w", Dialer: d, Backend: "webtransport"},
		{Address: "y", Dialer: d, Backend: "yamux"},
		{Address: "r", Dialer: d, Backend: "yamux", Class: ClassRelay},
	}
}

func TestPlanOffsetsAndOverride(t *testing.T) {
	eps := classEndpoints(&failDialer{})
	a := fbAgent(t, eps, Fallback{NetworkID: func() string { return "net-a" }})
	p, memo := a.planRace(eps)
	ms := time.Millisecond
	wantOff := []time.Duration{0, 0, 250 * ms, 500 * ms, 1000 * ms}
	wantPred := []int{-1, 0, -1, -1, -1}
	for i := range eps {
		if p.offset[i] != wantOff[i] || p.pred[i] != wantPred[i] || p.gap[i] >= 0 {
			t.Errorf("endpoint %d: offset %v pred %d gap %v", i, p.offset[i], p.pred[i], p.gap[i])
		}
	}
	if memo != "" {
		t.Fatalf("memo %q without memory", memo)
	}
	// The daemon's fallback_stagger_ms replaces the class offsets.
	a.mu.Lock()
	a.classStagger = []time.Duration{100 * ms}
	a.mu.Unlock()
	p, _ = a.planRace(eps)
	if p.offset[2] != 100*ms || p.offset[3] != 200*ms || p.offset[4] != 300*ms {
		t.Fatalf("override offsets %v", p.offset)
	}
	// Config.FallbackStagger staggers within a class.
	a.cfg.FallbackStagger = []time.Duration{20 * ms}
	if p, _ = a.planRace(eps); p.gap[1] != 20*ms {
		t.Fatalf("same-class gap %v", p.gap[1])
	}
}

func TestPlanMemoryPerNetworkWithTTL(t *testing.T) {
	eps := classEndpoints(&failDialer{})
	now := time.Unix(1_000_000, 0)
	network := "net-a"
	c := testConfig(t)
	c.Endpoints, c.SpoolDir = eps, t.TempDir()
	c.Fallback = Fallback{MemoryTTL: time.Minute, NetworkID: func() string { return network }}
	c.Now = func() time.Time { return now }
	a, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	a.network = "net-a"
	a.noteRegistered(eps[3], "test", eps) // yamux won on net-a
	p, memo := a.planRace(eps)
	if p.offset[3] != 0 || p.offset[0] != 250*time.Millisecond || p.offset[4] != 1250*time.Millisecond || memo != "yamux (tcp)" {
		t.Fatalf("remembered: offsets %v memo %q", p.offset, memo)
	}
	if st := a.Stats(); st.BackendChanges[BackendChange{From: "quic", To: "yamux"}] != 1 {
		t.Fatalf("changes %v", st.BackendChanges)
	}
	// Another network: no memory.
	a.network = "net-b"
	if p, memo = a.planRace(eps); p.offset[3] != 500*time.Millisecond || memo != "" {
		t.Fatalf("other network: offsets %v memo %q", p.offset, memo)
	}
	// Expired.
	a.network = "net-a"
	now = now.Add(time.Minute + time.Second)
	if p, memo = a.planRace(eps); p.offset[3] != 500*time.Millisecond || memo != "" {
		t.Fatalf("expired: offsets %v memo %q", p.offset, memo)
	}
	// Remembering the best class changes nothing.
	now = time.Unix(1_000_000, 0)
	a.noteRegistered(eps[0], "test", eps)
	if p, memo = a.planRace(eps); p.offset[3] != 500*time.Millisecond || memo != "" {
		t.Fatalf("best class remembered: offsets %v memo %q", p.offset, memo)
	}
}

// TestRacePullsForwardOnFailure: when every candidate in flight failed the
// next starts at once, so a round of refusals does not wait for the class
// offsets (0 + 250 + 500 + 1000 ms).
func TestRacePullsForwardOnFailure(t *testing.T) {
	d := &failDialer{}
	eps := classEndpoints(d)
	a := fbAgent(t, eps, Fallback{})
	p, _ := a.planRace(eps)
	start := time.Now()
	w, failed := a.race(context.Background(), eps, p)
	if el := time.Since(start); el > 200*time.Millisecond {
		t.Fatalf("race of refusals took %v", el)
	}
	if w != nil || len(failed) != len(eps) || d.calls.Load() != int64(len(eps)) {
		t.Fatalf("winner %v, failed %d, dials %d", w, len(failed), d.calls.Load())
	}
}

func TestInterfaceNetworkIDStable(t *testing.T) {
	a, b := InterfaceNetworkID(), InterfaceNetworkID()
	if a != b || len(a) != 12 && a != "unknown" {
		t.Fatalf("%q %q", a, b)
	}
}

func TestClassFromBackend(t *testing.T) {
	for b, want := range map[string]Class{"quic": ClassQUIC, "memory": ClassQUIC, "webtransport": ClassWebTransport, "yamux": ClassTCP} {
		if got := (Endpoint{Backend: b}).class(); got != want {
			t.Errorf("%s: %v, want %v", b, got, want)
		}
	}
	if (Endpoint{Backend: "yamux", Class: ClassRelay}).class() != ClassRelay {
		t.Error("explicit class ignored")
	}
}
