package daemon

import (
	"time"

	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// heartbeatInterval is the interval a registration is given while n
// sessions are registered (itself included): the heartbeat budget (Timing
// MaxHeartbeatsPerSecond) spread over them, within
// [HeartbeatInterval, MaxHeartbeatInterval].
func (t Timing) heartbeatInterval(n int) time.Duration {
	iv := t.HeartbeatInterval
	if t.MaxHeartbeatsPerSecond > 0 {
		need := time.Duration(float64(n) / t.MaxHeartbeatsPerSecond * float64(time.Second))
		iv = min(max(iv, need), t.MaxHeartbeatInterval)
	}
	return iv
}

// livenessLimit is how long c may be silent: 3 of its heartbeat intervals
// plus the grace. c.mu is held.
func (c *conn) livenessLimit() time.Duration {
	iv := c.hbInterval
	if iv <= 0 {
		iv = c.d.timing.HeartbeatInterval
	}
	return 3*iv + c.d.timing.HeartbeatGrace
}

func (c *conn) resetLiveness() {
	d := c.d
	c.mu.Lock()
	defer c.mu.Unlock()
	limit, iv := c.livenessLimit(), c.hbInterval
	c.lastHB = d.now()
	if c.hbTimer == nil {
		c.hbTimer = time.AfterFunc(limit, func() {
			c.logger().Info("no heartbeat for 3 intervals; closing", "limit", limit, "interval", iv)
			c.closeNow(wire.CloseIdleTimeout, "no heartbeat for 3 intervals")
		})
		return
	}
	c.hbTimer.Reset(limit)
}

func (c *conn) onHeartbeat(env *wire.Envelope, m *agentwire.HeartbeatV1) {
	d := c.d
	if m.Session != c.session || m.Runner != c.runner {
		c.violation(env.MessageID, wire.ErrCodeInvalidValue, "heartbeat for another session")
		return
	}
	d.mu.Lock()
	last, seen := d.hbSeq[c.session]
	if seen && m.Seq <= last {
		d.mu.Unlock()
		d.st.hbDropped.Add(1)
		return // out-of-order or duplicate: dropped, never acted on (§235)
	}
	if !seen && len(d.hbSeq) >= maxSeqSessions {
		for k := range d.hbSeq { // bounded: forget an arbitrary old session
			if _, live := d.bySession[k]; !live {
				delete(d.hbSeq, k)
				break
			}
		}
	}
	d.hbSeq[c.session] = m.Seq
	d.mu.Unlock()
	c.resetLiveness()
	c.noteHeartbeat(d.now()) // inventory.go
	c.checkDigest(m.CapabilityDigest)
	c.reply(env, &agentwire.HeartbeatAckV1{Seq: m.Seq, ServerTimeMs: uint64(d.now().UnixMilli())})
	// Heartbeats re-assert phases whose PhaseChangeV1 was lost; the set of
	// remembered attempts is the heartbeat's (≤ MaxActiveAttempts). In
	// order with the PhaseChangeV1 and completions received before it.
	c.ordered(func() {
		next := make(map[wire.JobAttemptId]agentwire.AttemptPhase, len(m.ActiveAttempts))
		for _, a := range m.ActiveAttempts {
			next[a.Attempt] = a.Phase
			if p, ok := c.phases[a.Attempt]; !ok || p != a.Phase {
				c.phaseEvent(a.Attempt, a.Lease, a.Phase)
			}
		}
		c.phases = next
	})
}
