package daemon

import (
	"time"

	"forgeyard.dev/transport/wire"
)

// Event-driven revocation checks (issue 14 item 3). The full check
// (checkRevocations) asks the authority about every live transport's
// credential: at 10,000 agents and the default 2 s poll that is thousands
// of credentials a second. With an authority that delivers events
// (authority.Watcher, PostgreSQL LISTEN/NOTIFY) every daemon sharing it
// learns of a disabled runner or a revoked certificate at once
// (authority.EventRunner) and re-checks only that runner's transports; the
// full check remains as a fallback for events lost while the listening
// connection was down, every RevocationFallbackPoll (or RevocationPoll, if
// longer). Without events (SQLite: one daemon, but the CLI may write the
// database) the poll keeps its period.

// RevocationFallbackPoll is the period of the full revocation check while
// the authority delivers events.
const RevocationFallbackPoll = time.Minute

// revocationPeriod returns the full check's period for a configured poll.
func (d *Daemon) revocationPeriod(poll time.Duration) time.Duration {
	if d.watching {
		return max(poll, RevocationFallbackPoll)
	}
	return poll
}

// runnerChanged re-checks the transports of runner on this daemon after an
// authority.EventRunner.
func (d *Daemon) runnerChanged(runner wire.RunnerId) {
	var conns []*conn
	for _, c := range d.runnerConns(runner) {
		if c.registered() {
			conns = append(conns, c)
		}
	}
	d.revocationEvents.Add(1)
	d.checkRevocationsOf(conns)
}
