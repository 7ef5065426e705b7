package authoritytest

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/wire"
)

func inventory(t *testing.T, a authority.Authority) authority.Inventory {
	t.Helper()
	return facet(t, a, authority.InventoryOf, "has no runner inventory")
}

// RunInventory runs the runner-inventory conformance tests (capabilities,
// presence, health, drain; issue 16 items 3–5). With o.Shared it also
// checks that a second instance over the same storage (another daemon of
// an HA set) sees every record and honours the drain state.
func RunInventory(t *testing.T, o Opener) {
	t.Run("Capabilities", func(t *testing.T) { testInvCapabilities(t, o) })
	t.Run("PresenceAndHeartbeat", func(t *testing.T) { testInvPresence(t, o) })
	t.Run("Health", func(t *testing.T) { testInvHealth(t, o) })
	t.Run("Drain", func(t *testing.T) { testInvDrain(t, o) })
	t.Run("ListAndBounds", func(t *testing.T) { testInvList(t, o) })
	t.Run("PeersHeldBy", func(t *testing.T) { testPeers(t, o) })
	runShared(t, o, "Shared", testInvShared)
}

func sampleCaps(i int) authority.Capabilities {
	return authority.Capabilities{OS: "linux", Arch: "amd64", Labels: []string{"gpu", "zone-" + string(rune('a'+i))},
		MaxParallel: 4, CPUMillis: 8000, MemBytes: 1 << 34, DiskBytes: 1<<63 + 5, Tools: []string{"go1.25"}, Digest: wire.Digest{byte(i), 1}}
}

func sameStrings(a, b []string) bool { return slices.Equal(a, b) }

func testInvCapabilities(t *testing.T, o Opener) {
	inv := inventory(t, o.Open(t))
	ctx := context.Background()
	r := wire.NewRunnerId()
	if _, err := inv.Runner(ctx, r); !errors.Is(err, authority.ErrNotFound) {
		t.Fatalf("unknown runner: %v, want ErrNotFound", err)
	}
	c := sampleCaps(1)
	if err := inv.PutCapabilities(ctx, r, c, t0); err != nil {
		t.Fatal(err)
	}
	rec, err := inv.Runner(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	got := rec.Capabilities
	if got.OS != c.OS || got.Arch != c.Arch || !sameStrings(got.Labels, c.Labels) || !sameStrings(got.Tools, c.Tools) ||
		got.MaxParallel != c.MaxParallel || got.CPUMillis != c.CPUMillis || got.MemBytes != c.MemBytes ||
		got.DiskBytes != c.DiskBytes || got.Digest != c.Digest || !rec.CapsUpdated.Equal(t0) {
		t.Fatalf("capabilities round trip: got %+v (updated %v), want %+v", got, rec.CapsUpdated, c)
	}
	// An update replaces the snapshot (§95: full snapshots).
	c2 := sampleCaps(2)
	c2.Labels, c2.Tools = nil, nil
	if err := inv.PutCapabilities(ctx, r, c2, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	rec, err = inv.Runner(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Capabilities.Labels) != 0 || len(rec.Capabilities.Tools) != 0 || rec.Capabilities.Digest != c2.Digest || !rec.CapsUpdated.Equal(t0.Add(time.Minute)) {
		t.Fatalf("update not applied: %+v", rec)
	}
	bad := sampleCaps(3)
	bad.Labels = []string{""}
	if err := inv.PutCapabilities(ctx, r, bad, t0); err == nil {
		t.Error("empty label accepted")
	}
	bad = sampleCaps(3)
	bad.Labels = make([]string, authority.MaxInventoryLabels+1)
	for i := range bad.Labels {
		bad.Labels[i] = "l"
	}
	if err := inv.PutCapabilities(ctx, r, bad, t0); err == nil {
		t.Error("too many labels accepted")
	}
}

func testInvPresence(t *testing.T, o Opener) {
	inv := inventory(t, o.Open(t))
	ctx := context.Background()
	r, s1, s2 := wire.NewRunnerId(), wire.NewAgentSessionId(), wire.NewAgentSessionId()
	p := authority.Presence{Runner: r, Session: s1, Daemon: "d1", Backend: "quic", Protocol: "1.4", AgentVersion: "agent 1.2",
		ConnectedAt: t0, LastHeartbeat: t0, Connected: true}
	if err := inv.PutPresence(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := inv.TouchHeartbeat(ctx, r, s1, t0.Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	// An older heartbeat never moves it back; another session's does
	// not touch it.
	_ = inv.TouchHeartbeat(ctx, r, s1, t0.Add(5*time.Second))
	_ = inv.TouchHeartbeat(ctx, r, s2, t0.Add(time.Hour))
	rec, err := inv.Runner(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	want := p
	want.LastHeartbeat = t0.Add(10 * time.Second)
	if !reflect.DeepEqual(rec.Presence, want) {
		t.Fatalf("presence %+v, want %+v", rec.Presence, want)
	}
	// The session moves to daemon d2; d1's late disconnect of the old
	// session must not mark the new one gone.
	p2 := authority.Presence{Runner: r, Session: s2, Daemon: "d2", Backend: "yamux", Protocol: "1.4", AgentVersion: "agent 1.2",
		ConnectedAt: t0.Add(time.Minute), LastHeartbeat: t0.Add(time.Minute), Connected: true}
	if err := inv.PutPresence(ctx, p2); err != nil {
		t.Fatal(err)
	}
	if err := inv.PutPresence(ctx, authority.Presence{Runner: r, Session: s1, Daemon: "d1", LastHeartbeat: t0.Add(20 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	rec, _ = inv.Runner(ctx, r)
	if !rec.Presence.Connected || rec.Presence.Daemon != "d2" || rec.Presence.Backend != "yamux" {
		t.Fatalf("a stale disconnect overwrote the current presence: %+v", rec.Presence)
	}
	if err := inv.PutPresence(ctx, authority.Presence{Runner: r, Session: s2, Daemon: "d2", LastHeartbeat: t0.Add(2 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	rec, _ = inv.Runner(ctx, r)
	if rec.Presence.Connected || !rec.Presence.LastHeartbeat.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("disconnect not recorded: %+v", rec.Presence)
	}
}

func testInvHealth(t *testing.T, o Opener) {
	inv := inventory(t, o.Open(t))
	ctx := context.Background()
	r := wire.NewRunnerId()
	h := authority.Health{Status: "Degraded", UptimeMs: 12345, Probe: "Disk", ReportedAt: t0,
		Checks: []authority.HealthCheck{{Name: "disk", Status: "Degraded", Message: "3% free"}, {Name: "clock", Status: "Healthy"}}}
	if err := inv.PutHealth(ctx, r, h); err != nil {
		t.Fatal(err)
	}
	rec, err := inv.Runner(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rec.Health, h) {
		t.Fatalf("health %+v, want %+v", rec.Health, h)
	}
	h.Checks = make([]authority.HealthCheck, authority.MaxHealthChecks+1)
	if err := inv.PutHealth(ctx, r, h); err == nil {
		t.Error("too many checks accepted")
	}
}

func testInvDrain(t *testing.T, o Opener) {
	inv := inventory(t, o.Open(t))
	ctx := context.Background()
	r := wire.NewRunnerId()
	if d, err := inv.DrainState(ctx, r); err != nil || d.Drained {
		t.Fatalf("unknown runner drain state %+v, %v", d, err)
	}
	for range 2 { // idempotent
		if err := inv.SetDrain(ctx, r, true, "kernel upgrade", t0); err != nil {
			t.Fatal(err)
		}
	}
	d, err := inv.DrainState(ctx, r)
	if err != nil || !d.Drained || d.Reason != "kernel upgrade" || !d.Changed.Equal(t0) {
		t.Fatalf("drain state %+v, %v", d, err)
	}
	if err := inv.SetDrain(ctx, r, false, "", t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if d, _ := inv.DrainState(ctx, r); d.Drained {
		t.Fatal("resume not recorded")
	}
	rec, err := inv.Runner(ctx, r)
	if err != nil || rec.Drain.Drained || !rec.Drain.Changed.Equal(t0.Add(time.Hour)) {
		t.Fatalf("record drain %+v, %v", rec.Drain, err)
	}
}

func testInvList(t *testing.T, o Opener) {
	inv := inventory(t, o.Open(t))
	ctx := context.Background()
	var ids []wire.RunnerId
	for i := range 5 {
		r := wire.NewRunnerId()
		ids = append(ids, r)
		switch i % 3 { // a runner known by any one table is listed
		case 0:
			_ = inv.PutCapabilities(ctx, r, sampleCaps(i), t0)
		case 1:
			_ = inv.SetDrain(ctx, r, true, "x", t0)
		case 2:
			_ = inv.PutHealth(ctx, r, authority.Health{Status: "Healthy", ReportedAt: t0})
		}
	}
	all, err := inv.Runners(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(ids) {
		t.Fatalf("listed %d runners, want %d", len(all), len(ids))
	}
	for i := 1; i < len(all); i++ {
		if string(all[i-1].Runner.ULID[:]) >= string(all[i].Runner.ULID[:]) {
			t.Fatal("runners not ordered by id")
		}
	}
	two, err := inv.Runners(ctx, 2)
	if err != nil || len(two) != 2 || two[0].Runner != all[0].Runner {
		t.Fatalf("limit 2: %d runners, %v", len(two), err)
	}
}

func testInvShared(t *testing.T, o Opener) {
	a := inventory(t, o.Open(t))
	b := inventory(t, o.Shared(t))
	ctx := context.Background()
	r := wire.NewRunnerId()
	if err := a.SetDrain(ctx, r, true, "maintenance", t0); err != nil {
		t.Fatal(err)
	}
	if err := a.PutCapabilities(ctx, r, sampleCaps(4), t0); err != nil {
		t.Fatal(err)
	}
	d, err := b.DrainState(ctx, r)
	if err != nil || !d.Drained || d.Reason != "maintenance" {
		t.Fatalf("the other instance sees drain %+v, %v", d, err)
	}
	rec, err := b.Runner(ctx, r)
	if err != nil || rec.Capabilities.Digest != sampleCaps(4).Digest {
		t.Fatalf("the other instance sees %+v, %v", rec, err)
	}
	if err := b.SetDrain(ctx, r, false, "", t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if d, _ := a.DrainState(ctx, r); d.Drained {
		t.Fatal("resume on the other instance not seen")
	}
}

// testPeers checks Peers.HeldBy: the live sessions a daemon held, with the
// backend from presence when it is recorded, without ended sessions,
// sessions another daemon took over, or transports presence records as
// gone.
func testPeers(t *testing.T, o Opener) {
	a := o.Open(t)
	ps := facet(t, a, authority.PeersOf, "has no Peers")
	inv := inventory(t, a)
	ctx := context.Background()
	transports := map[wire.AgentSessionId]wire.TransportSessionId{}
	reg := func(daemon, remote string) (wire.RunnerId, wire.AgentSessionId) {
		t.Helper()
		r, s, tr := wire.NewRunnerId(), wire.NewAgentSessionId(), wire.NewTransportSessionId()
		if _, err := a.RegisterSession(ctx, authority.Registration{Runner: r, Session: s, Transport: tr,
			Daemon: daemon, Remote: remote, Now: t0}); err != nil {
			t.Fatal(err)
		}
		transports[s] = tr
		return r, s
	}
	presence := func(r wire.RunnerId, s wire.AgentSessionId, daemon, backend string, connected bool) {
		t.Helper()
		if err := inv.PutPresence(ctx, authority.Presence{Runner: r, Session: s, Daemon: daemon, Backend: backend,
			ConnectedAt: t0, LastHeartbeat: t0, Connected: connected}); err != nil {
			t.Fatal(err)
		}
	}
	r1, s1 := reg("d1", "127.0.0.1:4001") // quic, connected
	presence(r1, s1, "d1", "quic", true)
	_, s2 := reg("d1", "127.0.0.1:4002")  // no presence record yet
	r3, s3 := reg("d1", "127.0.0.1:4003") // transport ended
	presence(r3, s3, "d1", "quic", true)
	presence(r3, s3, "d1", "", false)
	_, s4 := reg("d1", "127.0.0.1:4004") // session ended
	if err := a.EndSession(ctx, s4, t0); err != nil {
		t.Fatal(err)
	}
	reg("d2", "127.0.0.1:4005") // another daemon's
	got, err := ps.HeldBy(ctx, "d1", 0)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(x, y authority.Peer) int { return strings.Compare(x.Remote, y.Remote) })
	want := []authority.Peer{{Backend: "quic", Remote: "127.0.0.1:4001", Session: s1, Transport: transports[s1]},
		{Backend: "", Remote: "127.0.0.1:4002", Session: s2, Transport: transports[s2]}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("HeldBy(d1) = %+v, want %+v", got, want)
	}
	if got, err := ps.HeldBy(ctx, "d1", 1); err != nil || len(got) != 1 {
		t.Fatalf("HeldBy(d1, limit 1) = %+v, %v; want one peer", got, err)
	}
}
