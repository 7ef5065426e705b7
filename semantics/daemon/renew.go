package daemon

import (
	"errors"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// onRenew answers a renewal; it returns the message's outcome for
// forgeyard_transport_messages_total.
func (c *conn) onRenew(env *wire.Envelope, m *agentwire.LeaseRenewV1) telemetry.Outcome {
	d := c.d
	now := d.authNow() // the authority's clock (dbclock.go)
	actx, acancel := c.authCtx()
	defer acancel()
	res, err := d.auth.RenewLease(actx, env.MessageID, m.Lease, m.Attempt, c.ref(), now)
	switch {
	case errors.Is(err, authority.ErrFenced):
		c.fencedErr(env)
		return telemetry.OutcomeRejected
	case errors.Is(err, authority.ErrStaleSession):
		res = authority.RenewResult{Unknown: true}
	case err != nil:
		return c.authUnavailable(env, "renew", err, "lease", m.Lease.String())
	}
	d.st.renewals.Add(1)
	var out agentwire.RenewOutcomeV1
	switch {
	case res.Extended:
		out = agentwire.RenewOutcomeV1{Kind: agentwire.RenewExtended, ExpiresAtMs: uint64(d.toLocal(res.ExpiresAt).UnixMilli()), TTLMs: ms32(res.ExpiresAt.Sub(now))}
		d.mu.Lock()
		delete(d.probing, m.Lease)
		d.mu.Unlock()
	case res.Revoked:
		out = agentwire.RenewOutcomeV1{Kind: agentwire.RenewRevoked, Reason: agentwire.CancellationReason(res.CancelReason)}
	default:
		out = agentwire.RenewOutcomeV1{Kind: agentwire.RenewUnknown}
		c.auditEvent(telemetry.EventStaleLeaseReplay, wire.ErrCodeStaleLease, telemetry.ReasonLeaseSuperseded)
	}
	c.reply(env, &agentwire.LeaseRenewAckV1{Lease: m.Lease, Attempt: m.Attempt, Outcome: out})
	return telemetry.OutcomeOK
}

// expireLeases implements lease expiry with grace: a lease expired by more
// than RevokeGrace is revoked; within the grace, if this daemon holds the
// session's transport, the agent is probed (LeaseProbeV1) and a renewal in
// the window saves the lease.
//
// The expiry is judged on the authority's clock (dbclock.go): with
// PostgreSQL, the database time read at the start of this sweep, against
// the ExpiresAt every daemon wrote on the same clock, so a daemon whose
// wall clock is skewed neither revokes live leases nor keeps dead ones.
// (SQLite has one daemon: `now`, its clock, is the database's clock.)
func (d *Daemon) expireLeases(now time.Time) {
	if d.dbc.c != nil {
		dbNow, err := d.readDBClock(d.ctx)
		if err != nil {
			d.authorityFailed("sweep", err)
			return
		}
		now = dbNow
	}
	ls, err := d.auth.ExpiredLeases(d.ctx, now, 256)
	if err != nil {
		d.authorityFailed("sweep", err)
		return
	}
	// Daemons sharing an authority elect one sweeper (SweepElector): it
	// expires every lease past its grace. The others expire only the
	// leases of sessions they hold, so the agent hears the cancel at once;
	// they leave the rest to the leader instead of racing it for them.
	lead := true
	if el := authority.SweepElectorOf(d.auth); el != nil {
		if lead, err = el.SweepLeader(d.ctx); err != nil {
			d.authorityFailed("sweep_leader", err)
			lead = false
		}
	}
	seen := map[wire.LeaseId]bool{}
	for _, l := range ls {
		seen[l.ID] = true
		if now.Sub(l.ExpiresAt) > d.timing.RevokeGrace {
			if !lead && d.sessionConn(l.Session) == nil {
				continue
			}
			// The same rule, judged again under the lease's row lock: a
			// renewal committed since ExpiredLeases (here or on another
			// daemon) keeps the lease, and only the sweep that expired it acts.
			expired, err := d.auth.ExpireLease(d.ctx, l.ID, now.Add(-d.timing.RevokeGrace))
			if err != nil {
				d.authorityFailed("sweep", err, "lease", l.ID.String())
			}
			if err == nil && expired {
				d.st.leasesRevoked.Add(1)
				d.forgetAttemptLog(l.Attempt)
				if c := d.sessionConn(l.Session); c != nil && c.channel() != nil {
					_, _ = c.channel().Send(control.Out{Msg: &agentwire.CancelAttemptV1{Attempt: l.Attempt, Lease: l.ID, Reason: agentwire.CancelLeaseRevoked},
						Priority: semantics.PriorityCancel, UsePriority: true})
				}
			}
			d.mu.Lock()
			delete(d.probing, l.ID)
			d.mu.Unlock()
			continue
		}
		d.mu.Lock()
		_, probed := d.probing[l.ID]
		if !probed {
			d.probing[l.ID] = now
		}
		d.mu.Unlock()
		if probed {
			continue
		}
		if c := d.sessionConn(l.Session); c != nil && c.channel() != nil && c.active() {
			d.st.probes.Add(1)
			_, _ = c.channel().Send(control.Out{Msg: &agentwire.LeaseProbeV1{Lease: l.ID, Attempt: l.Attempt,
				GraceUntilMs: uint64(d.toLocal(l.ExpiresAt.Add(d.timing.RevokeGrace)).UnixMilli())}, Priority: semantics.PriorityLease, UsePriority: true})
		}
	}
	d.mu.Lock()
	for id := range d.probing {
		if !seen[id] {
			delete(d.probing, id) // renewed or gone
		}
	}
	d.mu.Unlock()
}
