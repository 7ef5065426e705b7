package agent

import (
	"context"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/control"
	agentwire "forgeyard.dev/transport/wire/agent"
)

func (a *Agent) heartbeatLoop(ctx context.Context, l *link) {
	a.mu.Lock()
	every := a.hbEvery
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
		a.hbSeq++
		hb := &agentwire.HeartbeatV1{Runner: a.cfg.Runner, Session: a.session, Seq: a.hbSeq, CapabilityDigest: a.digest}
		for id, at := range a.attempts {
			if !at.finished && len(hb.ActiveAttempts) < agentwire.MaxActiveAttempts {
				hb.ActiveAttempts = append(hb.ActiveAttempts, agentwire.ActiveAttemptV1{Attempt: id, Lease: at.job.Lease, Phase: at.phase})
			}
		}
		hb.Resources.RunningJobs = uint16(len(hb.ActiveAttempts))
		a.mu.Unlock()
		a.st.hbSent.Add(1)
		// Heartbeats are never replayed (§235): one send, one wait.
		sent := time.Now()
		env, err := l.ch.Call(ctx, control.Out{Msg: hb, Priority: semantics.PriorityLease, UsePriority: true}, every)
		if err != nil {
			continue
		}
		if _, ok := env.Payload.(*agentwire.HeartbeatAckV1); ok {
			a.cfg.Metrics.ObserveHeartbeatRTT(time.Since(sent))
			a.st.hbAcked.Add(1)
			a.mu.Lock()
			a.lastAck = a.now()
			a.mu.Unlock()
		}
	}
}
