package agent

import (
	"context"
	"sync"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	"go.opentelemetry.io/otel/trace"
)

func (a *Agent) onOffer(l *link, env *wire.Envelope, m *agentwire.LeaseOfferV1) {
	pctx := context.Background()
	if l.features.Has(wire.FeatureTraceContextV1) {
		pctx = telemetry.ExtractEnvelope(pctx, env)
	}
	sctx, sp := a.cfg.Tracing.Start(pctx, telemetry.SpanLeaseAck, telemetry.AttrLease(m.Lease), telemetry.AttrAttempt(m.Attempt))
	defer sp.End()
	a.mu.Lock()
	if prev, ok := a.answers[m.Lease]; ok {
		a.mu.Unlock()
		a.st.dupOffers.Add(1)
		l.ch.SetOutcome(telemetry.OutcomeDuplicate)
		a.sendAnswer(sctx, l, env, m, prev)
		prev.Duplicate = true
		if h := a.cfg.Hooks.OnOffer; h != nil {
			h(prev)
		}
		return
	}
	ev := OfferEvent{Lease: m.Lease, Attempt: m.Attempt}
	running := 0
	for _, at := range a.attempts {
		if !at.finished {
			running++
		}
	}
	_, dupAttempt := a.attempts[m.Attempt]
	switch {
	case !a.execs:
		ev.Reason = agentwire.RejectUnsupportedSpec
	case m.Session != a.session:
		ev.Reason = agentwire.RejectOther
	case a.draining:
		ev.Reason = agentwire.RejectDraining
	case dupAttempt:
		ev.Reason = agentwire.RejectDuplicateAttempt
	case running >= a.cfg.MaxParallel:
		ev.Reason = agentwire.RejectAtCapacity
	case int64(m.ExpiresAtMs) < a.daemonNow().UnixMilli(): // the daemon's clock (clock.go)
		ev.Reason = agentwire.RejectExpired
	default:
		ev.Accepted = true
	}
	var at *attempt
	var actx context.Context
	if ev.Accepted {
		var cancel context.CancelFunc
		actx, cancel = context.WithCancel(a.ctx)
		at = &attempt{cancel: cancel, job: Job{Lease: m.Lease, Attempt: m.Attempt, Job: m.Job, Spec: m.SpecID, Payload: m.PayloadRef},
			trace: trace.ContextWithSpanContext(context.Background(), sp.SpanContext())}
		at.io = a.newAttemptIO(at.job, a.epoch)
		a.attempts[m.Attempt] = at
		a.st.accepted.Add(1)
	} else {
		a.st.rejected.Add(1)
	}
	a.rememberAnswer(ev)
	a.mu.Unlock()
	a.sendAnswer(sctx, l, env, m, ev)
	if h := a.cfg.Hooks.OnOffer; h != nil {
		h(ev)
	}
	if at != nil {
		a.leaseUntil(at, m.ExpiresAtMs)
		a.st.started.Add(1)
		if h := a.cfg.Hooks.OnAttemptStarted; h != nil {
			h(at.job)
		}
		if cur, _ := a.currentLink(); cur != nil {
			a.attachLog(cur, at, 0)
		}
		a.wg.Add(1)
		go a.execute(actx, at)
	}
}

// rememberAnswer records an offer's answer for duplicate offers, keeping
// the last answerRetention (a ring of lease ids and the map: bounded
// memory, no re-sliced queue; the ring grows with the answers, so an agent
// that was offered nothing holds none of its 64 KiB); under a.mu.
func (a *Agent) rememberAnswer(ev OfferEvent) {
	if _, ok := a.answers[ev.Lease]; !ok {
		if len(a.ansRing) < answerRetention {
			a.ansRing = append(a.ansRing, ev.Lease)
		} else {
			delete(a.answers, a.ansRing[a.ansNext])
			a.ansRing[a.ansNext] = ev.Lease
			a.ansNext = (a.ansNext + 1) % answerRetention
		}
	}
	a.answers[ev.Lease] = ev
}

func (a *Agent) sendAnswer(ctx context.Context, l *link, env *wire.Envelope, m *agentwire.LeaseOfferV1, ev OfferEvent) {
	var msg wire.Message
	if ev.Accepted {
		msg = &agentwire.LeaseAcceptedV1{Lease: m.Lease, Attempt: m.Attempt, Session: a.session}
	} else {
		msg = &agentwire.LeaseRejectedV1{Lease: m.Lease, Attempt: m.Attempt, Reason: ev.Reason, Message: ev.Reason.String()}
	}
	_ = l.ch.ReplyOut(env, l.traceOut(ctx, control.Out{Msg: msg}))
}

func (a *Agent) renewLoop(ctx context.Context, l *link) {
	a.mu.Lock()
	every := a.renewEvery
	a.mu.Unlock()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.mu.Lock()
		var live []*attempt
		for _, at := range a.attempts {
			if !at.finished {
				live = append(live, at)
			}
		}
		a.mu.Unlock()
		var wg sync.WaitGroup
		for _, at := range live {
			wg.Add(1)
			go func() { defer wg.Done(); a.renew(ctx, l, at) }()
		}
		wg.Wait()
	}
}

func (a *Agent) renew(ctx context.Context, l *link, at *attempt) {
	a.mu.Lock()
	phase := at.phase
	a.mu.Unlock()
	env, err := l.ch.Call(ctx, control.Out{Msg: &agentwire.LeaseRenewV1{Lease: at.job.Lease, Attempt: at.job.Attempt, ObservedPhase: phase},
		Priority: semantics.PriorityLease, UsePriority: true}, a.cfg.RequestTimeout)
	if err != nil {
		return
	}
	ack, ok := env.Payload.(*agentwire.LeaseRenewAckV1)
	if !ok {
		return
	}
	switch ack.Outcome.Kind {
	case agentwire.RenewExtended:
		a.leaseUntil(at, ack.Outcome.ExpiresAtMs)
	case agentwire.RenewRevoked:
		a.stopAttempt(at.job.Attempt, ack.Outcome.Reason, false)
	case agentwire.RenewUnknown:
		a.stopAttempt(at.job.Attempt, agentwire.CancelLeaseRevoked, false)
	}
}

// stopAttempt cancels an attempt's executor. discard drops it without a
// completion (Stale). Attempts already waiting for a completion ack are
// left alone: the completion answer is authoritative.
func (a *Agent) stopAttempt(id wire.JobAttemptId, reason agentwire.CancellationReason, discard bool) {
	a.mu.Lock()
	at := a.attempts[id]
	if at == nil || at.compl != nil {
		a.mu.Unlock()
		return
	}
	if discard {
		at.discard = true
	}
	fresh := !at.finished && !at.stopped // a duplicate cancel (§174) is not a new one
	at.stopped = true
	a.mu.Unlock()
	at.cancel()
	if fresh {
		a.st.cancels.Add(1)
		if h := a.cfg.Hooks.OnCancel; h != nil {
			h(id, reason)
		}
	}
}
