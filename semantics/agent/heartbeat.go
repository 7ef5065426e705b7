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
	"forgeyard.dev/transport/wire"
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

// ErrDaemonRestarted ends a link on which a restart hint carrying the
// link's restart token arrived (agentwire.RestartTokenV1,
// semantics.RestartTokenHinter): the daemon crashed and restarted, and
// told this session so with a token only it could derive. The agent
// reconnects as after any other cut, without waiting for a heartbeat.
var ErrDaemonRestarted = errors.New("agent: the daemon restarted (authenticated restart hint)")

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

// heartbeatState is one link's heartbeat loop state (heartbeatLoop):
// its pacing, the dead-link rule and restart hints.
type heartbeatState struct {
	a           *Agent
	l           *link
	every       time.Duration
	misses      int
	start       time.Time
	lv          *liveness
	t           *time.Ticker
	dead        *time.Timer
	calls       sync.WaitGroup
	wait        time.Duration // how long each heartbeat waits for its ack
	quickEvery  time.Duration
	quick       bool
	outstanding atomic.Int64
	hintDead    *time.Timer // hintWindow after the last answered hint
	hintDeadC   <-chan time.Time
	probes      int           // heartbeats left to send for the last hint
	hintAt      time.Duration // offset of the last hint answered
	cur         time.Duration // the ticker's period
}

// heartbeatLoop sends a heartbeat every interval (the daemon's) and
// watches the link's liveness: when no heartbeat was acked for
// heartbeatMisses intervals it closes l.dead and returns (serve ends the
// link with ErrHeartbeatTimeout).
func (a *Agent) heartbeatLoop(ctx context.Context, l *link) {
	a.mu.Lock()
	every := a.hbEvery
	a.mu.Unlock()
	h := &heartbeatState{a: a, l: l, every: every, misses: a.cfg.heartbeatMisses(), start: time.Now()}
	h.lv = newLiveness(h.misses, every)
	h.t = time.NewTicker(every)
	defer h.t.Stop()
	var deadC <-chan time.Time // nil when the rule is off
	if h.lv.window > 0 {
		h.dead = time.NewTimer(h.lv.window)
		defer h.dead.Stop()
		deadC = h.dead.C
	}
	defer h.calls.Wait()
	defer func() {
		if h.hintDead != nil {
			h.hintDead.Stop()
		}
	}()
	// Each heartbeat waits for its ack up to the liveness window (one
	// interval when the rule is off), in its own goroutine: a late ack
	// still counts, and the next heartbeat is not held back by it.
	h.wait = h.lv.window
	if h.wait <= 0 {
		h.wait = every
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
	h.quickEvery = max(every/4, 100*time.Millisecond)
	// Restart hints (semantics.PeerHinter): the backend heard that the
	// daemon may have restarted and lost this connection. The agent sends
	// a heartbeat within hintSpread and then about every probeEvery until
	// one sent after the hint is acked (a live daemon: the next tick ends it) or the
	// connection ends (the restarted daemon's stateless reset), at most
	// maxProbes; hints closer than probeEvery to the last are ignored.
	// (A hint carrying the link's restart token ends the link in serve:
	// restartedC.)
	var hintC <-chan struct{}
	if ph, ok := l.bc.(semantics.PeerHinter); ok {
		hintC = ph.PeerHints()
	}
	h.cur = every
	for {
		select {
		case <-ctx.Done():
			return
		case <-hintC:
			h.onRestartHint()
			continue
		case <-h.hintDeadC:
			if h.hintUnanswered() {
				return
			}
			continue
		case <-deadC:
			if h.linkDead() {
				return
			}
			continue
		case <-h.t.C:
		}
		h.pace()
		h.send(ctx, h.heartbeat())
	}
}

// onRestartHint is the restart-hint step: it starts probing (maxProbes
// heartbeats) and the hint's window, unless a hint is being answered.
func (h *heartbeatState) onRestartHint() {
	now := time.Since(h.start)
	if h.probes > 0 || (h.hintAt > 0 && now-h.hintAt < probeEvery) {
		return
	}
	h.a.st.restartHints.Add(1)
	h.hintAt, h.probes = now, maxProbes
	// The first heartbeat within hintSpread, not at once: agents
	// behind one socket (a NAT, a load generator) hear one hint
	// together, and a restarted daemon drops the stateless resets
	// of a burst (quic-go queues 4).
	h.cur = 0
	h.t.Reset(1 + time.Duration(rand.Int64N(int64(hintSpread))))
	if h.hintDead == nil {
		h.hintDead = time.NewTimer(hintWindow)
	} else {
		h.hintDead.Reset(hintWindow)
	}
	h.hintDeadC = h.hintDead.C
}

// restartedC is the channel on which l's connection reports a restart
// hint carrying the link's restart token (nil: the backend has none);
// serve ends the link on it with ErrDaemonRestarted (daemonRestarted).
func restartedC(l *link) <-chan struct{} {
	if rh, ok := l.bc.(semantics.RestartTokenHinter); ok {
		return rh.PeerRestarted()
	}
	return nil
}

// daemonRestarted counts and logs an authenticated restart hint and
// returns the link's end: ErrDaemonRestarted.
func (a *Agent) daemonRestarted(l *link) error {
	a.st.restartTokenEnds.Add(1)
	a.log.Info("the daemon restarted (restart hint with this link's token): reconnecting",
		"backend", l.ep.Backend, "endpoint", l.ep.Address)
	return ErrDaemonRestarted
}

// armRestartToken arms l's connection with the restart token the daemon
// gave it (agentwire.RestartTokenV1), when the link negotiated
// wire.FeatureRestartTokenV1 and the backend can check hints
// (semantics.RestartTokenHinter); a token for another transport is
// ignored.
func (a *Agent) armRestartToken(l *link, m *agentwire.RestartTokenV1) {
	rh, ok := l.bc.(semantics.RestartTokenHinter)
	if !ok || !l.features.Has(wire.FeatureRestartTokenV1) || m.TransportSession != l.transport {
		return
	}
	rh.ArmRestartToken(semantics.RestartToken{KeyID: m.KeyID, Token: m.Token})
	a.st.restartTokens.Add(1)
}

// hintUnanswered is the restart hint's liveness judgement at the end of
// its window: it reports whether the link is dead (no ack since the
// hint), closing l.dead with ErrRestartHinted.
func (h *heartbeatState) hintUnanswered() bool {
	h.hintDeadC = nil
	if time.Duration(h.lv.last.Load()) > h.hintAt {
		return false // acked: a live daemon
	}
	h.a.st.hintTimeouts.Add(1)
	h.a.log.Info("restart hint and no heartbeat ack: link considered dead, reconnecting",
		"backend", h.l.ep.Backend, "endpoint", h.l.ep.Address, "window", hintWindow.String())
	h.l.deadOnce.Do(func() { h.l.deadErr = ErrRestartHinted; close(h.l.dead) })
	return true
}

// linkDead is the dead-link rule's judgement when its timer fires: it
// reports whether the link is dead, closing l.dead with
// ErrHeartbeatTimeout, or moves the deadline after a later ack.
func (h *heartbeatState) linkDead() bool {
	now := time.Since(h.start)
	if r := h.lv.remaining(now); r > 0 {
		h.dead.Reset(r) // an ack moved the deadline
		return false
	}
	last := time.Duration(h.lv.last.Load())
	h.a.st.hbTimeouts.Add(1)
	h.a.log.Warn("no heartbeat ack: link considered dead, reconnecting",
		"backend", h.l.ep.Backend, "endpoint", h.l.ep.Address, "interval", h.every.String(), "misses", h.misses,
		"since_last_ack", (now - last).String(), "acked_any", last > 0, "outstanding", h.outstanding.Load())
	h.l.deadOnce.Do(func() { h.l.deadErr = ErrHeartbeatTimeout; close(h.l.dead) })
	return true
}

// pace is the pacing step before each heartbeat: it ends answered hint
// probes, quickens or relaxes heartbeats, and resets the ticker to the
// next period.
func (h *heartbeatState) pace() {
	every := h.every
	if h.probes > 0 && time.Duration(h.lv.last.Load()) > h.hintAt {
		h.probes = 0 // the daemon answered a heartbeat sent after the hint
	}
	if q := time.Since(h.start)-time.Duration(h.lv.last.Load()) > every+every/4; q != h.quick && h.quickEvery < every {
		h.quick = q
		if h.quick {
			h.a.st.hbQuickened.Add(1)
		}
	}
	next := every
	if h.quick {
		next = h.quickEvery
	}
	if h.probes > 0 {
		h.probes--
		next = min(next, probeEvery/2+time.Duration(rand.Int64N(int64(probeEvery)))) // spread, as above
	}
	if next != h.cur {
		h.cur = next
		h.t.Reset(next)
	}
}

// heartbeat builds the next HeartbeatV1: its sequence number, capability
// digest and the active attempts.
func (h *heartbeatState) heartbeat() *agentwire.HeartbeatV1 {
	a := h.a
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
	return hb
}

// send is the send-heartbeat step: it sends hb and, in its own goroutine,
// waits for and handles its ack (server time, liveness, RTT).
func (h *heartbeatState) send(ctx context.Context, hb *agentwire.HeartbeatV1) {
	a, l, lv, start, wait := h.a, h.l, h.lv, h.start, h.wait
	a.st.hbSent.Add(1)
	// Heartbeats are never replayed (§235): one send, one wait.
	h.calls.Add(1)
	h.outstanding.Add(1)
	go func() {
		defer h.calls.Done()
		defer h.outstanding.Add(-1)
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
