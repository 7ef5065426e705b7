package daemon

import (
	"context"
	"errors"
	"sync"
	"time"

	"forgeyard.dev/transport/semantics/internal/tokenbucket"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
)

// Authority outages (issue 15 item 7). When the authority (PostgreSQL or
// SQLite) fails, every path of the daemon that called it does the same
// three things, here:
//
//   - the cause (the database error) is logged at Warn with the operation,
//     rate-limited per operation: at most authLogBurst lines at once, then
//     one per authLogEvery; the lines left out are counted and the next
//     line written reports them ("suppressed");
//   - the message being handled counts as outcome="error" in
//     forgeyard_transport_messages_total (the caller returns
//     telemetry.OutcomeError), and forgeyard_authority_errors_total{kind=
//     "failed"} counts the call when the authority is instrumented
//     (authmetrics);
//   - the agent is answered WireErrorV1{Internal, RetryBackoff} (or
//     RegistrationRejectedV1 with the same code and retry) whose message
//     is msgAuthorityUnavailable, never the database's text: it retries
//     with backoff, with the same MessageId, so nothing it sent is lost
//     and a retry the authority already recorded answers as a duplicate.
//
// Nothing is cached or queued on the daemon meanwhile: the agent keeps
// what the daemon could not record, and the daemon recovers as soon as
// the database answers again (database/sql reconnects on its own).

const (
	authLogBurst = 3
	authLogEvery = 5 * time.Second
)

// authFailLog is the daemon's rate-limited log of authority failures.
type authFailLog struct {
	mu         sync.Mutex
	ops        map[string]*authFailOp
	failures   int64
	suppressed int64
}

type authFailOp struct {
	b          *tokenbucket.Bucket
	failures   int64
	suppressed int64 // since the last line written for this operation
}

// AuthorityFailureStats counts the authority failures the daemon met on
// its paths since New (issue 15 item 7).
type AuthorityFailureStats struct {
	// Failures is the number of failed authority calls; each was logged
	// or counted in LogsSuppressed.
	Failures int64
	// LogsSuppressed is the number of failures not logged by the rate
	// limit (each written line reports how many it follows).
	LogsSuppressed int64
	// ByOperation counts Failures by operation (the "op" of the log
	// line: register, renew, accept_lease, complete, ...).
	ByOperation map[string]int64
}

// AuthorityFailures returns the authority failures met so far.
func (d *Daemon) AuthorityFailures() AuthorityFailureStats {
	l := &d.authFail
	l.mu.Lock()
	defer l.mu.Unlock()
	out := AuthorityFailureStats{Failures: l.failures, LogsSuppressed: l.suppressed, ByOperation: map[string]int64{}}
	for op, o := range l.ops {
		out.ByOperation[op] = o.failures
	}
	return out
}

// authUnavailable answers env "authority unavailable" (internal, retry
// with backoff) and records the failure of op: what a request handler does
// when its authority call failed for no reason the handler answers itself.
func (c *conn) authUnavailable(env *wire.Envelope, op string, err error, attrs ...any) telemetry.Outcome {
	c.replyErr(env, wire.ErrCodeInternal, wire.RetryBackoff, msgAuthorityUnavailable)
	return c.d.authorityFailed(op, err, attrs...)
}

// authorityFailed records an authority failure of op (see above) and
// returns telemetry.OutcomeError for the message being handled. attrs are
// extra log attributes (key, value pairs). A failure caused by the
// daemon's own shutdown is not logged.
func (d *Daemon) authorityFailed(op string, err error, attrs ...any) telemetry.Outcome {
	if err == nil {
		return telemetry.OutcomeError
	}
	if d.ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return telemetry.OutcomeError // shutting down: not an outage
	}
	l := &d.authFail
	l.mu.Lock()
	if l.ops == nil {
		l.ops = map[string]*authFailOp{}
	}
	o := l.ops[op]
	if o == nil {
		o = &authFailOp{b: tokenbucket.New(1/authLogEvery.Seconds(), authLogBurst)}
		l.ops[op] = o
	}
	l.failures++
	o.failures++
	ok, _ := o.b.Take(time.Now())
	var skipped int64
	if ok {
		skipped, o.suppressed = o.suppressed, 0
	} else {
		o.suppressed++
		l.suppressed++
	}
	l.mu.Unlock()
	if ok {
		d.log.Warn("authority unavailable", append([]any{"op", op, "err", err, "suppressed", skipped}, attrs...)...)
	}
	return telemetry.OutcomeError
}
