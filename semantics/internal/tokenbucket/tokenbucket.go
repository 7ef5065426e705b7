// Package tokenbucket is the module's one token bucket: every rate limit
// of semantics/ (the daemon's per-connection message rates and its
// registration rate, the CAS bandwidth, the log receiver's per-attempt
// byte rate, the audit limiter) is a Bucket. It is a thin wrapper of
// golang.org/x/time/rate.Limiter adding the two operations those limits
// need: Take (one token or the wait for one, for retry-after hints) and
// Reserve (n tokens, going into debt, n may exceed the burst, for pacing
// bytes; the caller waits the delay it returns with Sleep, under its own
// context).
package tokenbucket

import (
	"context"
	"time"

	"golang.org/x/time/rate"
)

// Bucket is a token bucket: PerSecond tokens accrue per second up to
// Burst; it starts full. Safe for concurrent use. Times are the callers'
// (a fake clock works): a time before the last one used adds no tokens.
type Bucket struct {
	l     *rate.Limiter
	rate  float64
	burst int
}

// New returns a full bucket of perSecond tokens per second and burst
// tokens (burst < 1 is 1). perSecond ≤ 0: no tokens ever accrue (only the
// initial burst is taken).
func New(perSecond float64, burst int) *Bucket {
	burst = max(burst, 1)
	if perSecond < 0 {
		perSecond = 0
	}
	return &Bucket{l: rate.NewLimiter(rate.Limit(perSecond), burst), rate: perSecond, burst: burst}
}

// Take takes one token at now if there is one. Otherwise it takes nothing
// and reports how long until one accrues (time.Second when no tokens
// accrue).
func (b *Bucket) Take(now time.Time) (bool, time.Duration) {
	if b.l.AllowN(now, 1) {
		return true, 0
	}
	if b.rate <= 0 {
		return false, time.Second
	}
	missing := 1 - b.l.TokensAt(now)
	return false, time.Duration(missing / b.rate * float64(time.Second))
}

// Reserve takes n tokens at now, into debt when fewer are there (n may
// exceed the burst), and returns how long until the debt is paid: the
// caller waits that long before using what the tokens stand for (0: no
// wait). n ≤ 0 takes nothing.
func (b *Bucket) Reserve(now time.Time, n int) time.Duration {
	var d time.Duration
	for n > 0 {
		k := min(n, b.burst)
		r := b.l.ReserveN(now, k)
		if !r.OK() { // only when no tokens accrue and the burst is spent
			return rate.InfDuration
		}
		d = max(d, r.DelayFrom(now))
		n -= k
	}
	return d
}

// Sleep waits d (the delay Take or Reserve returned) or until ctx ends,
// whichever comes first, and reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
