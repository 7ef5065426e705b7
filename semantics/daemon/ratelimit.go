package daemon

import (
	"fmt"
	"sync"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/internal/tokenbucket"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wcas "forgeyard.dev/transport/wire/cas"
)

// rateClass names the per-connection limits of §266–269.
type rateClass uint8

const (
	rateControl rateClass = iota
	rateHeartbeat
	rateHealth
	rateCas
	rateIdentity
	numRateClasses
)

var rateClassNames = [numRateClasses]string{"control message", "heartbeat", "health request", "CAS request", "certificate request"}

// newBucket is the token bucket of rate r (the module's one token bucket,
// semantics/internal/tokenbucket).
func newBucket(r semantics.Rate) *tokenbucket.Bucket { return tokenbucket.New(r.PerSecond, r.Burst) }

// connRates are one connection's buckets and its strike count. mu makes
// a message's two takes (its class and the control class) and the strike
// count one step. A class's bucket is made when its first message comes:
// an idle agent sends control messages and heartbeats, rarely the others
// (five buckets up front were ≈ 1 KiB per idle agent).
type connRates struct {
	mu      sync.Mutex
	buckets [numRateClasses]*tokenbucket.Bucket
	strikes int
}

// bucket returns the bucket of class, making it on first use. Under r.mu.
func (c *conn) bucket(class rateClass) *tokenbucket.Bucket {
	r := &c.rl
	if b := r.buckets[class]; b != nil {
		return b
	}
	lim := c.sc.Limits()
	rate := [numRateClasses]semantics.Rate{rateControl: lim.ControlRate, rateHeartbeat: lim.HeartbeatRate,
		rateHealth: lim.HealthRate, rateCas: lim.CasRate, rateIdentity: lim.IdentityRate}[class]
	r.buckets[class] = newBucket(rate)
	return r.buckets[class]
}

// takeRate takes a token of class (and of the control class for control
// messages); it returns the class that refused and the wait, or ok.
func (c *conn) takeRate(class rateClass, control bool) (rateClass, time.Duration, bool) {
	r := &c.rl
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if control {
		if ok, wait := c.bucket(rateControl).Take(now); !ok {
			r.strikes++
			return rateControl, wait, false
		}
	}
	if class != rateControl {
		if ok, wait := c.bucket(class).Take(now); !ok {
			r.strikes++
			return class, wait, false
		}
	}
	if r.strikes > 0 {
		r.strikes--
	}
	return 0, 0, true
}

// struck closes the connection with CloseLimitExceeded once the strikes
// exceed Limits.MaxRateStrikes.
func (c *conn) struck() {
	r := &c.rl
	r.mu.Lock()
	n := r.strikes
	r.mu.Unlock()
	if n > c.sc.Limits().MaxRateStrikes {
		c.d.hard.limitCloses.Add(1)
		c.logger().Warn("closing: persistent rate limit violations", "strikes", n)
		c.closeNow(wire.CloseLimitExceeded, "persistent rate limit violations")
	}
}

// classOf returns the rate class of a control-stream message.
func classOf(t wire.MessageTypeId) rateClass {
	switch {
	case t == agentwire.MsgHeartbeat:
		return rateHeartbeat
	case t.Family() == wire.FamilyHealth:
		return rateHealth
	case t == wcas.MsgNeedObjects:
		return rateCas
	case t == agentwire.MsgCertificateRequest:
		return rateIdentity
	}
	return rateControl
}

// admitMessage applies the per-connection rates to a control-stream
// message. Over a rate the message is not acted on: it is answered with
// WireErrorV1{RateLimited, RetryBackoff} naming the limit and the wait
// (an agent's own WireErrorV1 is dropped unanswered), and the connection
// is closed with CloseLimitExceeded when the violations persist.
func (c *conn) admitMessage(env *wire.Envelope) bool {
	t := env.Payload.MessageType()
	class, wait, ok := c.takeRate(classOf(t), true)
	if ok {
		return true
	}
	c.d.hard.rateLimited[class].Add(1)
	if t != wire.MsgError {
		lim := c.sc.Limits()
		r := [numRateClasses]semantics.Rate{lim.ControlRate, lim.HeartbeatRate, lim.HealthRate, lim.CasRate, lim.IdentityRate}[class]
		_ = c.ch.ReplyError(env.MessageID, wire.ErrCodeRateLimited, wire.RetryBackoff,
			fmt.Sprintf("%s rate limit (%s) exceeded; retry after %v", rateClassNames[class], r, wait.Round(time.Millisecond)+time.Millisecond))
	}
	c.struck()
	return false
}

// admitCasStream applies CasRate to a CAS stream the peer opened; false:
// the caller resets it with StreamRefused.
func (c *conn) admitCasStream() bool {
	_, _, ok := c.takeRate(rateCas, false)
	if !ok {
		c.d.hard.rateLimited[rateCas].Add(1)
		c.struck()
	}
	return ok
}
