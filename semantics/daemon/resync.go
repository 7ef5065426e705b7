package daemon

import (
	"errors"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/session"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

func (c *conn) onResync(env *wire.Envelope, m *agentwire.AgentResyncV1) {
	d := c.d
	_, sp := c.span(env, telemetry.SpanResync, telemetry.AttrRunner(c.runner))
	defer sp.End()
	if m.Session != c.session {
		c.violation(env.MessageID, wire.ErrCodeInvalidValue, "resync for another session")
		return
	}
	claims := make([]authority.AttemptClaim, len(m.ActiveAttempts))
	for i, a := range m.ActiveAttempts {
		claims[i] = authority.AttemptClaim{Attempt: a.Attempt, Lease: a.Lease}
	}
	now := d.authNow() // the authority's clock (dbclock.go)
	actx, acancel := c.authCtx()
	defer acancel()
	decs, err := d.auth.Resync(actx, c.ref(), claims, now)
	switch {
	case errors.Is(err, authority.ErrFenced):
		c.fencedErr(env)
		return
	case errors.Is(err, authority.ErrStaleSession):
		c.replyErr(env, wire.ErrCodeStaleSession, wire.RetryNever, "agent session ended")
		c.closeAfter(wire.CloseSessionFenced, "agent session ended")
		return
	case err != nil:
		c.ch.SetOutcome(d.authorityFailed("resync", err, "session", c.session.String()))
		c.replyErr(env, wire.ErrCodeInternal, wire.RetryBackoff, msgAuthorityUnavailable)
		return
	}
	resp := &agentwire.ResyncResponseV1{Results: make([]agentwire.ResyncResultV1, len(decs))}
	for i, dec := range decs {
		r := agentwire.ResyncResultV1{Attempt: dec.Attempt, Lease: dec.Lease}
		switch dec.Kind {
		case authority.DecisionContinue:
			r.Decision = agentwire.ResyncDecisionV1{Kind: agentwire.DecisionContinue, ExpiresAtMs: uint64(d.toLocal(dec.ExpiresAt).UnixMilli()),
				TTLMs: ms32(dec.ExpiresAt.Sub(now))}
		case authority.DecisionCancel:
			r.Decision = agentwire.ResyncDecisionV1{Kind: agentwire.DecisionCancel, Reason: agentwire.CancellationReason(dec.CancelReason)}
		default:
			r.Decision = agentwire.ResyncDecisionV1{Kind: agentwire.DecisionStale}
		}
		resp.Results[i] = r
	}
	d.st.resyncs.Add(1)
	c.setState(session.Active)
	c.reply(env, resp)
	c.sendServerTime()       // servertime.go
	c.ordered(c.resendDrain) // a drain set elsewhere or before the reconnect (inventory.go)
	d.kickOffers(c.session)
	d.adoptOffers(c)
}
