package daemon_test

import (
	"context"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// TestPresenceExpires (issue 15): a daemon that crashed (or lost the
// database when its agents left) never records their disconnect; its
// runners' presence must not read "connected" forever. Two presences
// written by a daemon that is gone, one heartbeat PresenceStale + 1 min old
// and one fresh, on the database clock: the inventory of a daemon whose own
// clock is an hour behind (so it judges on the database's clock, not its
// own) lists the stale one as not connected and the fresh one as
// connected, each with its last heartbeat on that daemon's clock.
func TestPresenceExpires(t *testing.T) {
	ctx := context.Background()
	store, err := authority.OpenPostgres(ctx, pgtest.Shared(t).NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	const skew = -time.Hour
	w := enginetest.NewWorldWith(t, enginetest.MemoryBackend(), trusttest.NewPKI(t), store, func(c *daemon.Config) {
		c.Now = func() time.Time { return time.Now().Add(skew) }
	})
	dbNow, err := authority.ClockOf(store).DatabaseNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inv := authority.InventoryOf(store)
	put := func(age time.Duration) wire.RunnerId {
		r := wire.NewRunnerId()
		if err := inv.PutPresence(ctx, authority.Presence{Runner: r, Session: wire.NewAgentSessionId(), Daemon: "crashed-daemon",
			Backend: "quic", ConnectedAt: dbNow.Add(-age - time.Minute), LastHeartbeat: dbNow.Add(-age), Connected: true}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	stale, fresh := put(daemon.PresenceStale+time.Minute), put(time.Second)
	for _, c := range []struct {
		runner    wire.RunnerId
		connected bool
		age       time.Duration
	}{{stale, false, daemon.PresenceStale + time.Minute}, {fresh, true, time.Second}} {
		ri, err := w.D.Runner(ctx, c.runner)
		if err != nil {
			t.Fatal(err)
		}
		if ri.Connected != c.connected || ri.Local || ri.Daemon != "crashed-daemon" {
			t.Errorf("runner with a heartbeat %v old: connected %v local %v daemon %q; want connected %v through crashed-daemon",
				c.age, ri.Connected, ri.Local, ri.Daemon, c.connected)
		}
		// On the daemon's clock: an hour behind the database's.
		if got := time.Now().Add(skew).Sub(ri.LastHeartbeat); got < c.age-5*time.Second || got > c.age+30*time.Second {
			t.Errorf("runner with a heartbeat %v old: LastHeartbeat %v old on the daemon's clock", c.age, got)
		}
	}
	list, err := w.D.Runners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[wire.RunnerId]bool{}
	for _, ri := range list {
		got[ri.Runner] = ri.Connected
	}
	if got[stale] || !got[fresh] {
		t.Errorf("Runners: stale connected %v, fresh connected %v; want false, true", got[stale], got[fresh])
	}
}
