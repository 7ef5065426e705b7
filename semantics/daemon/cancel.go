package daemon

import (
	"context"
	"errors"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// CancelAttempt records the cancellation in the authority and delivers
// CancelAttemptV1 at cancel priority (§47, §132) on the transport holding
// the lease's session, retrying with the same MessageId every
// RequestTimeout until CancelAckV1. It returns nil once acknowledged, or
// nil at once when no transport of that session is on this daemon (the
// agent learns it at its next renewal or resync). authority.ErrNotFound:
// the attempt has no live lease. If ctx ends before the ack, ctx's error
// is returned; the cancel stays recorded.
func (d *Daemon) CancelAttempt(ctx context.Context, attempt wire.JobAttemptId, reason agentwire.CancellationReason) error {
	l, err := d.auth.CancelAttempt(ctx, attempt, uint32(reason), d.now())
	if err != nil {
		if !errors.Is(err, authority.ErrNotFound) && ctx.Err() == nil {
			d.authorityFailed("cancel", err, "attempt", attempt.String())
		}
		return err
	}
	d.st.cancels.Add(1)
	msg := &agentwire.CancelAttemptV1{Attempt: attempt, Lease: l.ID, Reason: reason}
	id := wire.NewMessageId()
	start := time.Now()
	sctx, sp := d.cfg.Tracing.Start(ctx, telemetry.SpanCancel, telemetry.AttrLease(l.ID), telemetry.AttrAttempt(attempt))
	defer sp.End()
	tc, hasTC := telemetry.Inject(sctx)
	for {
		c := d.sessionConn(l.Session)
		var ch *control.Channel
		if c != nil {
			ch = c.channel()
		}
		if ch == nil || !c.active() {
			return nil
		}
		out := control.Out{ID: id, Msg: msg, Priority: semantics.PriorityCancel, UsePriority: true}
		if hasTC && c.traced() {
			out.Trace, out.HasTrace = tc, true
		}
		_, err := ch.Call(ctx, out, d.timing.RequestTimeout)
		if err == nil {
			lat := time.Since(start)
			d.st.cancelLat.add(lat)
			d.cfg.Metrics.ObserveCancelDelivery(lat)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var we *wire.WireErrorV1
		if errors.As(err, &we) {
			return nil // the agent answered (e.g. unknown attempt): delivered
		}
		select { // the channel closed or timed out: wait a little and retry
		case <-ctx.Done():
			return ctx.Err()
		case <-d.ctx.Done():
			return ErrShutdown
		case <-time.After(min(d.timing.RequestTimeout, 50*time.Millisecond)):
		}
	}
}

// watchLoop delivers the cancels and revocations other daemons recorded
// (authority.Watcher) to the agent of the session, if it is connected here:
// the agent stops within milliseconds instead of at its next renewal. A
// repeated cancel is harmless (§73); an agent that is not connected learns
// it at resync or renewal as before.
func (d *Daemon) watchLoop(ch <-chan authority.Event) {
	defer d.wg.Done()
	for ev := range ch {
		if ev.Kind == authority.EventRunner {
			switch ev.Reason {
			case authority.RunnerEventCheck, authority.RunnerEventDisabled:
				d.runnerChanged(ev.Runner) // revocation.go: re-check that runner's transports
			default:
				d.onRunnerEvent(ev) // runnerevent.go: drain, resume
			}
			continue
		}
		c := d.sessionConn(ev.Session)
		if c == nil || c.channel() == nil || !c.active() {
			continue
		}
		reason := agentwire.CancelLeaseRevoked
		if ev.Kind == authority.EventCancel {
			reason = agentwire.CancellationReason(ev.Reason)
		}
		_, _ = c.channel().Send(control.Out{Msg: &agentwire.CancelAttemptV1{Attempt: ev.Attempt, Lease: ev.Lease, Reason: reason},
			Priority: semantics.PriorityCancel, UsePriority: true})
	}
}
