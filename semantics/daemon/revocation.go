package daemon

import (
	"context"
	"time"

	"forgeyard.dev/transport/semantics/authority"

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

// An authority that keeps a revocation revision (authority.RevocationRevisions:
// SQLite) lets the poll skip the full check while the revision has not
// moved since the last check that completed: at 10,000 idle agents that
// pass was 8 % of an idle daemon's CPU samples (docs/perf.md, "Steady cost
// per heartbeat"), for revocations that happen a few times a day. New
// transports need no poll: registration checks their credential.

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

// revocationRevision reads the authority's revocation revision before a
// full check; ok false (no revisions, or the read failed) means check in
// full.
func (d *Daemon) revocationRevision() (authority.Revision, bool) {
	rr := authority.RevocationRevisionsOf(d.auth)
	if rr == nil {
		return authority.Revision{}, false
	}
	ctx, cancel := context.WithTimeout(d.ctx, d.timing.RequestTimeout)
	defer cancel()
	rev, ok, err := rr.RevocationRevision(ctx)
	if err != nil {
		return authority.Revision{}, false
	}
	return rev, ok
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
