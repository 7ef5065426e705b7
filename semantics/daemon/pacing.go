package daemon

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"forgeyard.dev/transport/semantics/internal/tokenbucket"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// Registration pacing (issue 14): how the daemon answers a hello it cannot
// admit at once.
//
//   - Over the registration rate by at most MaxRegistrationHold, the hello
//     is held: the daemon reserves the next token of the rate and answers
//     when it is due. The agent waits on a connection it already paid the
//     handshake for instead of failing and coming back.
//   - Further over the rate, or at the connection cap or descriptor
//     headroom, the hello is deferred: an agent that advertised
//     wire.FeatureRetryAfterV1 gets agentwire.RegistrationDeferredV1 with
//     its own retry slot (below), every other agent the
//     RegistrationRejectedV1{Overloaded, RetryBackoff} of before, its text
//     naming the same wait. The connection is closed with CloseOverloaded.
//
// Retry slots: the deferred agents are handed consecutive slots one
// registration interval (1/rate) apart, after the backlog the rate already
// holds (the wait for a token, which includes the held hellos), each with
// up to one interval of jitter; a slot is at least MinRetryAfter and at
// most Timing.MaxBackoff away. So a herd of N agents refused at once comes
// back spread over N/rate seconds, about when each can be admitted,
// instead of all together after the same backoff.

// MaxRegistrationHold bounds how long a hello over the registration rate
// is held for its token before it is deferred instead (well below the
// agents' request timeout, 10 s by default, and the daemon's registration
// timeout).
const MaxRegistrationHold = 2 * time.Second

// MinRetryAfter is the shortest retry hint the daemon sends.
const MinRetryAfter = 250 * time.Millisecond

// capacityRetryAfter is the base of the hint at the connection cap or the
// descriptor headroom: capacity frees only as agents leave, so these
// agents are spread over [base, 2·base).
const capacityRetryAfter = 5 * time.Second

// retryPacer hands out the retry slots of deferred registrations.
type retryPacer struct {
	mu   sync.Mutex
	next time.Time // the start of the next free slot
}

// slot returns the retry-after of one more deferred agent at now: the
// next free slot at or after now+backlog, slots 1/rate apart, plus up to
// one slot of jitter, within [MinRetryAfter, ceiling].
func (p *retryPacer) slot(now time.Time, backlog time.Duration, perSecond float64, ceiling time.Duration) time.Duration {
	interval := time.Second
	if perSecond > 0 {
		interval = time.Duration(float64(time.Second) / perSecond)
	}
	p.mu.Lock()
	at := now.Add(backlog)
	if p.next.After(at) {
		at = p.next
	}
	p.next = at.Add(interval)
	p.mu.Unlock()
	d := at.Sub(now) + time.Duration(rand.Int64N(int64(interval)+1))
	return min(max(d, MinRetryAfter), ceiling)
}

// registrationWait decides a hello's admission against the registration
// rate: (0, true) admit now; (d, true) admit after holding d; (d, false)
// defer with retry hint d.
func (d *Daemon) registrationWait(now time.Time) (time.Duration, bool) {
	h := &d.hard
	ok, wait := h.regs.Take(now)
	if ok {
		return 0, true
	}
	if wait <= MaxRegistrationHold {
		// Reserve the token: it is this hello's, due after the wait (the
		// held hellos are the backlog later arrivals see).
		if hold := h.regs.Reserve(now, 1); hold <= MaxRegistrationHold {
			return hold, true
		}
	}
	return d.pacer.slot(now, wait, h.adm.RegistrationRate.PerSecond, d.timing.MaxBackoff), false
}

// capacityRetryAfter returns the hint of a refusal at the connection cap.
func (d *Daemon) capacityHint() time.Duration {
	return min(capacityRetryAfter+time.Duration(rand.Int64N(int64(capacityRetryAfter))), d.timing.MaxBackoff)
}

// deferRegistration answers a hello the daemon does not admit now with
// the retry hint after (RegistrationDeferredV1 when the agent advertised
// RetryAfterV1, else RegistrationRejectedV1{code, RetryBackoff}) and
// closes with CloseOverloaded.
func (c *conn) deferRegistration(env *wire.Envelope, hello *agentwire.TransportHelloV1, code wire.ProtocolErrorCode,
	why string, after time.Duration, closeReason string) {
	h := &c.d.hard
	h.refusedRegs.Add(1)
	msg := fmt.Sprintf("%s; retry after %v", why, after.Round(time.Millisecond))
	if hello != nil && hello.Features.Has(wire.FeatureRetryAfterV1) && c.d.cfg.Features.Has(wire.FeatureRetryAfterV1) {
		h.deferred.Add(1)
		c.reply(env, &agentwire.RegistrationDeferredV1{Code: code, RetryAfterMs: uint32(min(after.Milliseconds(), agentwire.MaxRetryAfterMs)),
			Message: wire.TruncateUTF8(msg, agentwire.MaxRejectMessage)})
	} else {
		c.reply(env, &agentwire.RegistrationRejectedV1{Code: code, Retry: wire.RetryBackoff,
			Message: wire.TruncateUTF8(msg+" with jittered backoff", agentwire.MaxRejectMessage)})
	}
	c.closeAfter(wire.CloseOverloaded, closeReason)
}

// holdHello waits d for the hello's reserved registration token; false:
// the connection ended meanwhile.
func (c *conn) holdHello(d time.Duration) bool {
	c.d.hard.held.Add(1)
	return tokenbucket.Sleep(c.sc.Context(), d)
}
