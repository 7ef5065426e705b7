package agent

import (
	"sync"
	"time"

	agentwire "forgeyard.dev/transport/wire/agent"
)

// The daemon's clock (§146–148). The agent never trusts its own wall clock
// for a deadline the daemon set: it keeps the offset of the daemon's clock
// (ServerTimeV1, and the server time of HelloAckV1, RegistrationAcceptedV1
// and every HeartbeatAckV1, corrected by half the round trip when there is
// one) and judges every absolute daemon time — a lease offer's expiry, a
// renewal's or resync's new expiry, a secret's expiry — on daemonNow. The
// durations it waits are then local monotonic ones, so an agent whose
// clock is minutes off neither expires a lease early nor lets it overrun.

// DefaultLeaseGrace is Config.LeaseGrace's default.
const DefaultLeaseGrace = time.Second

// clockState is the estimated offset of the daemon's clock.
type clockState struct {
	mu     sync.Mutex
	offset time.Duration // daemon − local
	known  bool
	rtt    time.Duration // of the sample the offset came from; 0: none (ServerTimeV1)
	at     time.Time     // local time of that sample
}

// observeServerTime records a server time in Unix ms, read from an answer
// to a request sent at local time sent and received at recv (sent zero:
// an unsolicited ServerTimeV1, received at recv). A sample with a shorter
// round trip, or one newer than a minute, replaces the estimate.
func (a *Agent) observeServerTime(ms uint64, sent, recv time.Time) {
	if ms == 0 {
		return
	}
	mid, rtt := recv, time.Duration(0)
	if !sent.IsZero() && recv.After(sent) {
		rtt = recv.Sub(sent)
		mid = sent.Add(rtt / 2)
	}
	off := time.UnixMilli(int64(ms)).Sub(mid)
	c := &a.clk
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.known && rtt > c.rtt && recv.Sub(c.at) < time.Minute {
		return // a noisier sample than a recent better one
	}
	c.offset, c.known, c.rtt, c.at = off, true, rtt, recv
}

// ClockOffset is the estimated offset of the daemon's clock from the
// agent's (daemon − agent), and whether the agent has one yet.
func (a *Agent) ClockOffset() (time.Duration, bool) {
	a.clk.mu.Lock()
	defer a.clk.mu.Unlock()
	return a.clk.offset, a.clk.known
}

// clockError bounds the error of the offset estimate: half the round trip
// of its sample (the daemon read its clock somewhere within it).
func (a *Agent) clockError() time.Duration {
	a.clk.mu.Lock()
	defer a.clk.mu.Unlock()
	return a.clk.rtt / 2
}

// daemonNow is the agent's estimate of the daemon's clock now (its own
// clock before any server time arrived).
func (a *Agent) daemonNow() time.Time {
	off, _ := a.ClockOffset()
	return a.now().Add(off)
}

// leaseUntil sets the attempt's lease expiry, expiresAtMs on the daemon's
// clock (Unix ms). If no renewal moves it, Config.LeaseGrace after it: with
// no registered link the attempt is stopped (CancelLeaseRevoked) — the
// agent cannot learn otherwise, the daemon has revoked the lease or is
// about to, and the work would be refused; with a link the agent renews at
// once and the daemon's answer decides (Revoked and Unknown stop it), so a
// renewal merely delayed on a loaded machine never stops an attempt the
// daemon still holds.
func (a *Agent) leaseUntil(at *attempt, expiresAtMs uint64) {
	if expiresAtMs == 0 {
		return
	}
	// The estimate may be early by up to clockError: wait that much more,
	// so an attempt is never stopped before its lease ends on the daemon's
	// clock (a loaded machine's slow round trip makes it hundreds of ms).
	wait := time.UnixMilli(int64(expiresAtMs)).Sub(a.daemonNow()) + a.cfg.LeaseGrace + a.clockError()
	a.mu.Lock()
	defer a.mu.Unlock()
	if at.finished || at.stopped {
		return
	}
	if at.expiry == nil {
		at.expiry = time.AfterFunc(max(wait, 0), func() { a.leaseExpired(at) })
		return
	}
	at.expiry.Reset(max(wait, 0))
}

// leaseUntilLater re-arms the expiry timer for another grace period (the
// renewal leaseExpired started, or a later one, resets it).
func (a *Agent) leaseUntilLater(at *attempt) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if at.expiry != nil && !at.finished && !at.stopped {
		at.expiry.Reset(a.cfg.LeaseGrace)
	}
}

// leaseExpired stops an attempt whose lease ran out without a renewal.
func (a *Agent) leaseExpired(at *attempt) {
	a.mu.Lock()
	done := at.finished || at.stopped
	a.mu.Unlock()
	if done {
		return
	}
	if a.ctx.Err() != nil {
		return // closing: the attempts are being cancelled anyway
	}
	if l, _ := a.currentLink(); l != nil {
		a.leaseUntilLater(at)
		a.wg.Add(1)
		go func() { defer a.wg.Done(); a.renew(a.ctx, l, at) }()
		return
	}
	a.st.leaseExpired.Add(1)
	a.log.Warn("lease expired on the daemon's clock without a renewal and no link to renew it; stopping the attempt",
		"lease", at.job.Lease.String(), "attempt", at.job.Attempt.String())
	a.stopAttempt(at.job.Attempt, agentwire.CancelLeaseRevoked, false)
}
