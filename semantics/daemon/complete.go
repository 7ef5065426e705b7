package daemon

import (
	"context"
	"errors"
	"time"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// onCompletion records a completion and answers it; it returns the
// message's outcome for forgeyard_transport_messages_total.
func (c *conn) onCompletion(env *wire.Envelope, m *agentwire.AttemptCompletionV1) telemetry.Outcome {
	d := c.d
	_, sp := c.span(env, telemetry.SpanComplete, telemetry.AttrLease(m.Lease), telemetry.AttrAttempt(m.Attempt))
	defer sp.End()
	start := time.Now()
	if f, ok := d.completionBlocked(m); ok {
		// Never acknowledge a completion whose finalized log or declared
		// outputs are not durably stored (issue 15 item 4): the agent
		// keeps them and retries.
		c.replyErr(env, wire.ErrCodeStorageUnavailable, wire.RetryBackoff, f.Text())
		return telemetry.OutcomeError
	}
	result := m.Result
	actx, acancel := c.authCtx()
	defer acancel()
	ack, err := d.auth.CompleteAttempt(actx, authority.Completion{MessageID: env.MessageID, Attempt: m.Attempt,
		Lease: m.Lease, Session: c.ref(), Result: EncodeResult(result), Outputs: m.Outputs, Now: d.now()})
	switch {
	case errors.Is(err, authority.ErrFenced):
		c.fencedErr(env)
		return telemetry.OutcomeRejected
	case err != nil:
		return c.authUnavailable(env, "complete", err, "attempt", m.Attempt.String())
	}
	kind := agentwire.CompletionAckKind(ack)
	if int(kind) < len(d.st.completions) {
		d.st.completions[kind].Add(1)
	}
	// Sampled before the hook so hook observers (metrics) see it; the ack
	// write that follows is a buffered stream write.
	lat := time.Since(start)
	d.st.complLat.add(lat)
	d.cfg.Metrics.ObserveCompletionAck(lat)
	if kind == agentwire.AckStaleRejected {
		d.audit.Emit(context.Background(), telemetry.EventStaleLeaseReplay, telemetry.Runner(c.runner), telemetry.Session(c.session),
			telemetry.Transport(c.transport), telemetry.Remote(c.bc.RemoteAddr()), telemetry.Code(wire.ErrCodeStaleLease),
			telemetry.Reason(telemetry.ReasonLeaseSuperseded))
	}
	if h := d.cfg.Hooks.OnCompletion; h != nil {
		h(CompletionEvent{Runner: c.runner, Session: c.session, Transport: c.transport, MessageID: env.MessageID,
			Attempt: m.Attempt, Lease: m.Lease, Job: m.Job, Result: m.Result, Ack: kind})
	}
	c.reply(env, &agentwire.CompletionAckV1{Attempt: m.Attempt, Lease: m.Lease, Kind: kind})
	if kind == agentwire.AckAccepted || kind == agentwire.AckDuplicateAccepted {
		d.forgetAttemptLog(m.Attempt)
	}
	switch kind {
	case agentwire.AckAccepted:
		return telemetry.OutcomeOK
	case agentwire.AckDuplicateAccepted:
		return telemetry.OutcomeDuplicate
	}
	return telemetry.OutcomeRejected
}

func (c *conn) phaseEvent(attempt wire.JobAttemptId, lease wire.LeaseId, p agentwire.AttemptPhase) {
	if h := c.d.cfg.Hooks.OnPhase; h != nil {
		h(PhaseEvent{Runner: c.runner, Attempt: attempt, Lease: lease, Phase: p})
	}
}

// completionBlocked reports the data fault that keeps m from being
// accepted: the log store fails and the attempt's finalized log is not all
// durable, or the content store fails and a declared output is not stored.
func (d *Daemon) completionBlocked(m *agentwire.AttemptCompletionV1) (DataFault, bool) {
	if d.logSink != nil {
		d.mu.Lock()
		last, ok := d.finalSeq.get(m.Attempt)
		d.mu.Unlock()
		if f, bad := d.dataFault(StoreLogs); bad && ok && d.logSink.Durable(m.Attempt) < last {
			return f, true
		}
	}
	if d.cfg.ContentStore != nil && len(m.Outputs) > 0 {
		if f, bad := d.dataFault(StoreCAS); bad {
			for _, o := range m.Outputs {
				if st, err := d.cfg.ContentStore.Stat(o); err != nil || !st.Complete {
					return f, true
				}
			}
		}
	}
	return DataFault{}, false
}
