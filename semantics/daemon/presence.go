package daemon

import (
	"time"

	"forgeyard.dev/transport/semantics/authority"
)

// PresenceStale is how old a runner's last recorded heartbeat may be, on
// the authority's clock (dbclock.go), before the inventory stops counting
// the runner as connected through another daemon. A daemon records a
// connected runner's heartbeat time at most every 30 s (presenceEvery) and
// its disconnect when the transport ends; a daemon that crashed, or lost
// the database when the agent left, never records the disconnect, and its
// runners' presence would otherwise say "connected" forever. Runners
// connected to this daemon are judged live, not by this rule.
const PresenceStale = 3 * presenceEvery

// infoFromAuthority is the inventory record r as RunnerInfo: its times on
// this daemon's clock, and not Connected once its last heartbeat is older
// than PresenceStale (judged on the authority's clock).
func (d *Daemon) infoFromAuthority(r authority.RunnerRecord) RunnerInfo {
	ri := infoOf(r)
	if ri.Connected && d.authNow().Sub(r.Presence.LastHeartbeat) > PresenceStale {
		ri.Connected = false
	}
	ri.ConnectedAt, ri.LastHeartbeat = d.localTime(ri.ConnectedAt), d.localTime(ri.LastHeartbeat)
	return ri
}

// localTime is toLocal, keeping the zero time zero.
func (d *Daemon) localTime(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return d.toLocal(t)
}
