package agent

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/control"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// DefaultHeartbeatMisses is how many heartbeat intervals without any ack
// make the agent treat its link as dead (Config.HeartbeatMisses).
const DefaultHeartbeatMisses = 3

// ErrHeartbeatTimeout ends a link (Hooks.OnDisconnected) on which no
// heartbeat was acknowledged for Config.HeartbeatMisses intervals: the
// daemon died or the path went dark. The agent reconnects as after any
// other cut (same session, backoff, fallback).
var ErrHeartbeatTimeout = errors.New("agent: no heartbeat ack within the liveness window")

// ErrRestartHinted ends a link whose daemon sent a restart hint and then
// acknowledged no heartbeat within hintWindow: the daemon restarted and
// its stateless reset was lost (a restarted daemon under its reconnect
// storm drops most), or it is unresponsive. The agent reconnects as after
// any other cut.
var ErrRestartHinted = errors.New("agent: restart hint and no heartbeat ack within its window")

// liveness is the agent's dead-link rule: the link is dead once
// misses × every passed since the last ack of any heartbeat, or since the
// link started (its registration was answered) when none was acked yet.
// A slow daemon whose acks arrive late but within the window keeps the
// link alive: acks are not matched to the latest heartbeat, any ack of any
// outstanding heartbeat counts. Times are offsets from the link's start
// (monotonic).
type liveness struct {
	window time.Duration // misses × every; ≤ 0 disables the rule
	last   atomic.Int64  // offset of the last ack (0: the link's start)
}

func newLiveness(misses int, every time.Duration) *liveness {
	return &liveness{window: time.Duration(misses) * every}
}

// acked records an ack received at offset at (later acks win; an older
// one arriving late never moves the deadline back).
func (v *liveness) acked(at time.Duration) {
	for {
		old := v.last.Load()
		if int64(at) <= old || v.last.CompareAndSwap(old, int64(at)) {
			return
		}
	}
}

// remaining is how long until the link is dead at offset now; ≤ 0 means
// it is dead.
func (v *liveness) remaining(now time.Duration) time.Duration {
	return time.Duration(v.last.Load()) + v.window - now
}

// heartbeatMisses is Config.HeartbeatMisses with its default (negative:
// the rule is off).
func (c *Config) heartbeatMisses() int {
	switch {
	case c.HeartbeatMisses == 0:
		return DefaultHeartbeatMisses
	case c.HeartbeatMisses < 0:
		return 0
	}
	return c.HeartbeatMisses
}

// Answering restart hints (heartbeatLoop).
const (
	hintSpread = 200 * time.Millisecond // the first heartbeat, uniform in (0, hintSpread]
	probeEvery = 250 * time.Millisecond // the next ones, uniform in [probeEvery/2, 3·probeEvery/2)
	maxProbes  = 8                      // about 2 s of probing for one hint
	// hintWindow is how long after a hint the agent waits for an ack of
	// any heartbeat before it ends the link (ErrRestartHinted): a restart
	// is then noticed within it even when the daemon's stateless reset was
	// lost. A forged hint can end a link only if the daemon also answers
	// nothing for that long — a daemon the dead-link rule would soon give
	// up on too.
	hintWindow = time.Second
)

// heartbeatLoop sends a heartbeat every interval (the daemon's) and
// watches the link's liveness: when no heartbeat was acked for
// heartbeatMisses intervals it closes l.dead and returns (serve ends the
// link with ErrHeartbeatTimeout).
func (a *Agent) heartbeatLoop(ctx context.Context, l *link) {
	a.mu.Lock()
	every := a.hbEvery
	a.mu.Unlock()
	misses := a.cfg.heartbeatMisses()
	start := time.Now()
	lv := newLiveness(misses, every)
	t := time.NewTicker(every)
	defer t.Stop()
	var dead *time.Timer
	var deadC <-chan time.Time // nil when the rule is off
	if lv.window > 0 {
		dead = time.NewTimer(lv.window)
		defer dead.Stop()
		deadC = dead.C
	}
	var calls sync.WaitGroup
	defer calls.Wait()
	var outstanding atomic.Int64
	// Each heartbeat waits for its ack up to the liveness window (one
	// interval when the rule is off), in its own goroutine: a late ack
	// still counts, and the next heartbeat is not held back by it.
	wait := lv.window
	if wait <= 0 {
		wait = every
	}
	// Quickened heartbeats: while no heartbeat was acked for more than an
	// interval and a quarter, the agent sends them every quarter interval
	// (at least 100 ms apart) until an ack arrives. Every heartbeat is a
	// fresh packet, so a daemon that restarted answers one of them with a
	// QUIC stateless reset (its reset key survives restarts) within a
	// quarter interval instead of at the next regular heartbeat, and a
	// reset the restarted daemon dropped under load (quic-go queues only a
	// few) is asked for again soon; the dead-link rule is unchanged, so a
	// slow but live daemon still keeps the link.
	quickEvery := max(every/4, 100*time.Millisecond)
	quick := false
	// Restart hints (semantics.PeerHinter): the backend heard that the
	// daemon may have restarted and lost this connection. The agent sends
	// a heartbeat within hintSpread and then about every probeEvery until
	// one sent after the hint is acked (a live daemon: the next tick ends it) or the
	// connection ends (the restarted daemon's stateless reset), at most
	// maxProbes; hints closer than probeEvery to the last are ignored.
	var hintC <-chan struct{}
	if ph, ok := l.bc.(semantics.PeerHinter); ok {
		hintC = ph.PeerHints()
	}
	var hintDead *time.Timer // hintWindow after the last answered hint
	var hintDeadC <-chan time.Time
	probes := 0              // heartbeats left to send for the last hint
	var hintAt time.Duration // offset of the last hint answered
	cur := every             // the ticker's period
	for {
		select {
		case <-ctx.Done():
			return
		case <-hintC:
			now := time.Since(start)
			if probes > 0 || (hintAt > 0 && now-hintAt < probeEvery) {
				continue
			}
			a.st.restartHints.Add(1)
			hintAt, probes = now, maxProbes
			// The first heartbeat within hintSpread, not at once: agents
			// behind one socket (a NAT, a load generator) hear one hint
			// together, and a restarted daemon drops the stateless resets
			// of a burst (quic-go queues 4).
			cur = 0
			t.Reset(1 + time.Duration(rand.Int64N(int64(hintSpread))))
			if hintDead == nil {
				hintDead = time.NewTimer(hintWindow)
				defer hintDead.Stop()
			} else {
				hintDead.Reset(hintWindow)
			}
			hintDeadC = hintDead.C
			continue
		case <-hintDeadC:
			hintDeadC = nil
			if time.Duration(lv.last.Load()) > hintAt {
				continue // acked: a live daemon
			}
			a.st.hintTimeouts.Add(1)
			a.log.Info("restart hint and no heartbeat ack: link considered dead, reconnecting",
				"backend", l.ep.Backend, "endpoint", l.ep.Address, "window", hintWindow.String())
			l.deadOnce.Do(func() { l.deadErr = ErrRestartHinted; close(l.dead) })
			return
		case <-deadC:
			now := time.Since(start)
			if r := lv.remaining(now); r > 0 {
				dead.Reset(r) // an ack moved the deadline
				continue
			}
			last := time.Duration(lv.last.Load())
			a.st.hbTimeouts.Add(1)
			a.log.Warn("no heartbeat ack: link considered dead, reconnecting",
				"backend", l.ep.Backend, "endpoint", l.ep.Address, "interval", every.String(), "misses", misses,
				"since_last_ack", (now - last).String(), "acked_any", last > 0, "outstanding", outstanding.Load())
			l.deadOnce.Do(func() { l.deadErr = ErrHeartbeatTimeout; close(l.dead) })
			return
		case <-t.C:
		}
		if probes > 0 && time.Duration(lv.last.Load()) > hintAt {
			probes = 0 // the daemon answered a heartbeat sent after the hint
		}
		if q := time.Since(start)-time.Duration(lv.last.Load()) > every+every/4; q != quick && quickEvery < every {
			quick = q
			if quick {
				a.st.hbQuickened.Add(1)
			}
		}
		next := every
		if quick {
			next = quickEvery
		}
		if probes > 0 {
			probes--
			next = min(next, probeEvery/2+time.Duration(rand.Int64N(int64(probeEvery)))) // spread, as above
		}
		if next != cur {
			cur = next
			t.Reset(next)
		}
		a.mu.Lock()
		a.hbSeq++
		hb := &agentwire.HeartbeatV1{Runner: a.cfg.Runner, Session: a.session, Seq: a.hbSeq, CapabilityDigest: a.digest} // a.digest: under a.mu
		for id, at := range a.attempts {
			if !at.finished && len(hb.ActiveAttempts) < agentwire.MaxActiveAttempts {
				hb.ActiveAttempts = append(hb.ActiveAttempts, agentwire.ActiveAttemptV1{Attempt: id, Lease: at.job.Lease, Phase: at.phase})
			}
		}
		hb.Resources.RunningJobs = uint16(len(hb.ActiveAttempts))
		a.mu.Unlock()
		a.st.hbSent.Add(1)
		// Heartbeats are never replayed (§235): one send, one wait.
		calls.Add(1)
		outstanding.Add(1)
		go func() {
			defer calls.Done()
			defer outstanding.Add(-1)
			sent := time.Now()
			env, err := l.ch.Call(ctx, control.Out{Msg: hb, Priority: semantics.PriorityLease, UsePriority: true}, wait)
			if err != nil {
				return
			}
			if ack, ok := env.Payload.(*agentwire.HeartbeatAckV1); ok {
				a.observeServerTime(ack.ServerTimeMs, a.now().Add(-time.Since(sent)), a.now())
				lv.acked(time.Since(start))
				a.cfg.Metrics.ObserveHeartbeatRTT(time.Since(sent))
				a.st.hbAcked.Add(1)
				a.mu.Lock()
				a.lastAck = a.now()
				a.mu.Unlock()
			}
		}()
	}
}
