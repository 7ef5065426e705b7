package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"forgeyard.dev/transport/wire"
)

// Run connects and serves until ctx ends or Close (it then returns nil),
// or until every endpoint refused the agent permanently: a *VersionError
// (no common protocol version) or a *RejectedError (authentication,
// disabled runner, stale session). Transient failures are retried with
// backoff, reconnecting under the same AgentSessionId. Only one Run runs at
// a time; after ctx ended Run may be called again (same session), after
// Close it returns nil at once.
//
// Each connect races the endpoints (fallback.go): the first whose hello
// round trip completes registers, the others are closed.
func (a *Agent) Run(ctx context.Context) error {
	a.runMu.Lock()
	defer a.runMu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(a.ctx, cancel)
	defer stop()
	failures, authRounds := 0, 0
	for {
		if ctx.Err() != nil {
			return nil
		}
		eps := a.endpoints()
		network := a.fb.NetworkID()
		a.mu.Lock()
		a.network = network
		a.mu.Unlock()
		r, done := a.connectRound(ctx, eps)
		if done {
			return nil
		}
		if !r.registered && r.permCount == len(eps) && r.perm != nil {
			return r.perm
		}
		if r.registered {
			failures = 0
		}
		wait := a.roundWait(r, &failures, &authRounds)
		a.mu.Lock()
		a.retryAt = a.now().Add(wait)
		a.mu.Unlock()
		if !sleepCtx(ctx, wait) {
			return nil
		}
	}
}

// round is what one connectRound learned of its endpoints.
type round struct {
	perm       error // the first permanent failure
	permCount  int   // endpoints that failed permanently
	registered bool  // one registered (and was served until its link ended)
	auth       bool  // an endpoint failed authentication on the path
	// wait: the reconnect delay the daemon asked for (GoAway); hint: the
	// largest retry hint of a deferral (RegistrationDeferredV1).
	wait, hint time.Duration
}

// failed takes an endpoint's failure into r (its retry hint; a permanent
// one is counted, the first kept) and reports whether it was permanent.
func (r *round) failed(err error) bool {
	r.hint = max(r.hint, retryHint(err))
	if !isPermanent(err) {
		return false
	}
	r.permCount++
	if r.perm == nil {
		r.perm = err
	}
	return true
}

// connectRound is one pass over eps: race them (fallback.go), register on
// the winner, and serve it — and every link it moves to — until the link
// ends; a winner that fails to register leaves the others to race again.
// done reports that ctx ended.
func (a *Agent) connectRound(ctx context.Context, eps []Endpoint) (r round, done bool) {
	remaining := eps
	for len(remaining) > 0 {
		p, memo := a.planRace(remaining)
		w, failed := a.race(ctx, remaining, p)
		for _, err := range failed {
			if ctx.Err() != nil {
				return r, true
			}
			if IsAuthFailure(err) {
				r.auth = true
			}
			if r.failed(err) {
				continue
			}
			a.st.dialFailures.Add(1) // logged by race as it happened
		}
		if w == nil {
			return r, false
		}
		reason := describeRace(remaining, w, failed, memo)
		var rest []Endpoint
		for i := range remaining {
			if _, bad := failed[i]; !bad && i != w.i {
				rest = append(rest, remaining[i])
			}
		}
		remaining = rest
		l := w.l
		err := a.register(ctx, l)
		if err == nil {
			r.registered = true
			a.noteRegistered(l.ep, reason, eps)
			for l != nil {
				next, _ := a.serve(ctx, l, eps)
				if l.reconnect > 0 {
					r.wait = l.reconnect
				}
				if l = next; l != nil {
					a.noteRegistered(l.ep, a.moveReason(l), eps)
				}
			}
			return r, false
		}
		if ctx.Err() != nil {
			return r, true
		}
		if r.failed(err) {
			continue
		}
		a.st.dialFailures.Add(1)
		a.log.Warn("endpoint failed", "endpoint", w.l.ep.Address, "backend", w.l.ep.Backend, "err", err)
		a.noteDialError(w.l.ep, err)
	}
	return r, false
}

// roundWait is the wait before the next round after r: the daemon's
// reconnect delay if it gave one, else the backoff (the long
// authentication backoff after authRounds rounds that failed
// authentication on the path), and never before a deferral's retry hint.
func (a *Agent) roundWait(r round, failures, authRounds *int) time.Duration {
	switch {
	case r.registered || !r.auth:
		*authRounds = 0
	default:
		*authRounds++
	}
	wait := r.wait
	if wait == 0 {
		if d, ok := a.authBackoff(*authRounds); ok {
			wait = d
			a.log.Error("authentication on the path keeps failing: backing off so the account is not locked; fix the credentials (the error names the proxy and the scheme it asks for)",
				"consecutive_rounds", *authRounds, "retry_in", wait.Round(time.Second), "err", a.Status().LastDialError)
		} else {
			wait = a.backoff(*failures)
		}
		*failures++
	}
	if !r.registered && r.hint > 0 {
		// The daemon's retry hint: not before it, plus up to a tenth of
		// it of our own jitter (the daemon already spread the hints).
		wait = max(wait, r.hint+time.Duration(rand.Int64N(int64(r.hint/10)+1)))
		a.st.deferrals.Add(1)
	}
	return wait
}

// retryHint returns the retry hint err carries, or 0: a
// RegistrationDeferredV1 answer, or a backend's refusal before the
// handshake that says when to come back (an error with a RetryAfter()
// time.Duration method, as backends/quic's dial returns for a
// CONNECTION_REFUSED whose hint outlasts the dial).
func retryHint(err error) time.Duration {
	if re, ok := errors.AsType[*RejectedError](err); ok {
		return re.RetryAfter
	}
	if h, ok := errors.AsType[interface {
		error
		RetryAfter() time.Duration
	}](err); ok {
		return h.RetryAfter()
	}
	return 0
}

func isPermanent(err error) bool {
	var ve *VersionError
	var re *RejectedError
	return errors.As(err, &ve) || errors.As(err, &re) && re.permanent()
}

func (a *Agent) moveReason(l *link) string {
	return fmt.Sprintf("moved back to %s %s after %d consecutive successful probes", l.ep.Backend, l.ep.Address, a.fb.ProbeSuccesses)
}

// IsAuthFailure reports whether a dial error means credentials on the
// path were refused: err (or an error it wraps) has an AuthFailure() bool
// method that returns true, as backends/yamux/proxy's *AuthRequiredError
// (a 407) does. Such errors slow the reconnect down (Backoff.AuthMax).
func IsAuthFailure(err error) bool {
	af, ok := errors.AsType[interface {
		error
		AuthFailure() bool
	}](err)
	return ok && af.AuthFailure()
}

// authBackoff returns the wait after the k-th consecutive authentication
// round, and false while k ≤ AuthAfter (the ordinary schedule applies) or
// when the authentication backoff is off.
func (a *Agent) authBackoff(k int) (time.Duration, bool) {
	b := a.cfg.Backoff
	if b.AuthMax < 0 || k <= b.AuthAfter {
		return 0, false
	}
	d := authCeiling(k-b.AuthAfter, b.AuthMax)
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1)), true
}

// authCeiling is the k-th (from 1) authentication-backoff ceiling:
// min(ceiling, DefaultAuthBackoffBase·2^(k-1)).
func authCeiling(k int, ceiling time.Duration) time.Duration {
	d := min(DefaultAuthBackoffBase, ceiling)
	for i := 1; i < k && d < ceiling; i++ {
		d *= 2
	}
	return min(d, ceiling)
}

// AuthSchedule returns the first n ceilings of the authentication backoff
// of b (zero fields: the defaults), for documentation and status: the
// waits after AuthAfter consecutive authentication rounds, each drawn
// uniformly from [ceiling/2, ceiling]. Nil when the backoff is off.
func AuthSchedule(b Backoff, n int) []time.Duration {
	if b.AuthMax < 0 {
		return nil
	}
	if b.AuthMax == 0 {
		b.AuthMax = DefaultAuthBackoffMax
	}
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = authCeiling(i+1, b.AuthMax)
	}
	return out
}

// backoff returns a full-jitter wait for the n-th consecutive failure.
func (a *Agent) backoff(n int) time.Duration {
	a.mu.Lock()
	ceiling := a.maxBackoff
	a.mu.Unlock()
	return fullJitter(a.cfg.Backoff.Base, ceiling, n, rand.Int64N)
}

// fullJitter is the n-th wait: uniform in [0, min(ceiling, base·2ⁿ)], drawn
// with randN (rand.Int64N).
func fullJitter(base, ceiling time.Duration, n int, randN func(int64) int64) time.Duration {
	d := base
	for i := 0; i < n && d < ceiling; i++ {
		d *= 2
	}
	d = min(d, ceiling)
	return time.Duration(randN(int64(d) + 1))
}

// endpoints returns the dial order: a GoAway's alternates while its
// try_for window lasts, the configured endpoints, then the alternates from
// the last registration (alternates are dialed with the first endpoint's
// dialer).
func (a *Agent) endpoints() []Endpoint {
	a.mu.Lock()
	defer a.mu.Unlock()
	var eps []Endpoint
	seen := map[string]bool{}
	first := a.cfg.Endpoints[0]
	alt := func(addr string) {
		if !seen[addr] {
			seen[addr] = true
			eps = append(eps, Endpoint{Address: addr, Dialer: first.Dialer, Backend: first.Backend, Class: first.Class})
		}
	}
	// After a GoAway its alternates come first for try_for_ms.
	if a.now().Before(a.preferUntil) {
		for _, addr := range a.preferred {
			alt(addr)
		}
	}
	for _, e := range a.cfg.Endpoints {
		if !seen[e.Address] {
			seen[e.Address] = true
			eps = append(eps, e)
		}
	}
	for _, addr := range a.alternates {
		alt(addr)
	}
	return eps
}

// serve runs the registered l until it ends. While l is on a fallback
// class it probes the better endpoints among eps; when a probe earns the
// move, serve registers the probe's link (the daemon fences l), closes l
// and returns the new link (next != nil) for the caller to serve.
func (a *Agent) serve(ctx context.Context, l *link, eps []Endpoint) (next *link, endErr error) {
	closeCode, closeReason := wire.CloseNormal, "agent leaving"
	defer func() { l.close(closeCode, closeReason) }()
	a.setLink(l)
	a.syncCapabilities(l) // a change made while l was registering (inventory.go)
	a.attachAll(l)
	if h := a.cfg.Hooks.OnConnected; h != nil {
		h(a.Status())
	}
	lctx := l.ctx
	l.dead = make(chan struct{})
	var loops sync.WaitGroup
	loops.Add(1)
	go func() { defer loops.Done(); a.heartbeatLoop(lctx, l) }()
	loops.Add(1)
	go func() { defer loops.Done(); a.reportHealth(lctx, l) }() // health.go
	if a.execs {
		loops.Add(1)
		go func() { defer loops.Done(); a.renewLoop(lctx, l) }()
	}
	loops.Add(1)
	go func() { defer loops.Done(); a.serveSecrets(lctx, l) }() // secret.go
	if a.cfg.Credentials != nil {
		loops.Add(1)
		go func() { defer loops.Done(); a.certRenewLoop(lctx, l) }() // enroll.go
	}
	restarted := restartedC(l)
	moves := make(chan *link)
	loops.Add(1)
	go func() { defer loops.Done(); a.probeLoop(lctx, l.ep, eps, moves) }()
	for next == nil && endErr == nil {
		select {
		case <-l.sc.Done():
			endErr = l.sc.Err()
		case <-l.runDone:
			endErr = l.ch.Err()
		case <-ctx.Done():
			closeCode, closeReason = wire.CloseShutdown, "agent stopping"
			endErr = ctx.Err()
		case <-l.goaway:
			endErr = errors.New("agent: daemon sent GoAway")
		case <-l.dead:
			// No heartbeat ack for HeartbeatMisses intervals (heartbeat.go):
			// do not wait for the transport's idle timeout.
			closeCode, closeReason = wire.CloseIdleTimeout, "no heartbeat ack"
			endErr = l.deadErr
		case <-restarted:
			// A restart hint with this link's token (heartbeat.go): the
			// daemon lost the connection; no heartbeat needed to learn it.
			closeReason = "the daemon restarted"
			endErr = a.daemonRestarted(l)
		case p := <-moves:
			// Register the better transport first; the daemon fences l.
			if err := a.register(ctx, p); err != nil {
				a.log.Info("move back failed; staying", "backend", l.ep.Backend, "to", p.ep.Backend, "err", err)
				a.setProbeNote(fmt.Sprintf("moving back to %s %s failed: %v", p.ep.Backend, p.ep.Address, err))
				loops.Add(1)
				go func() { defer loops.Done(); a.probeLoop(lctx, l.ep, eps, moves) }()
				continue
			}
			a.log.Info("moved to a better backend", "from", l.ep.Backend, "to", p.ep.Backend, "endpoint", p.ep.Address)
			a.st.moves.Add(1)
			next = p
			closeReason = "moved to a better backend"
		}
	}
	l.lcancel()
	if next != nil {
		a.setLink(next)
	} else {
		a.clearLink(l)
	}
	loops.Wait()
	if next != nil {
		return next, nil
	}
	if ctx.Err() != nil {
		endErr = nil
	}
	if h := a.cfg.Hooks.OnDisconnected; h != nil {
		h(endErr)
	}
	return nil, endErr
}
