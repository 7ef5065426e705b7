package cas

import (
	"context"
	"sync"
	"time"
)

// Bandwidth is a token bucket (§134, §269) shared by every transfer that
// uses it: at most Rate bytes per second on average, bursts of at most
// Burst bytes. A nil *Bandwidth is unlimited. Safe for concurrent use.
type Bandwidth struct {
	rate  float64 // bytes per second
	burst float64

	mu     sync.Mutex
	tokens float64 // may go negative: reserved debt
	last   time.Time
}

// NewBandwidth returns a bucket of rate bytes per second and burst bytes
// (burst ≤ 0 means rate/10, at least 64 KiB). rate ≤ 0 returns nil
// (unlimited).
func NewBandwidth(rate int64, burst int) *Bandwidth {
	if rate <= 0 {
		return nil
	}
	b := float64(burst)
	if burst <= 0 {
		b = max(float64(rate)/10, 64<<10)
	}
	return &Bandwidth{rate: float64(rate), burst: b, tokens: b, last: time.Now()}
}

// Wait takes n bytes of budget, waiting until the bucket allows them or
// ctx ends (ctx's error; the budget stays taken). n may exceed the burst.
func (b *Bandwidth) Wait(ctx context.Context, n int) error {
	if b == nil || n <= 0 {
		return nil
	}
	b.mu.Lock()
	now := time.Now()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	b.tokens -= float64(n)
	var wait time.Duration
	if b.tokens < 0 {
		wait = time.Duration(-b.tokens / b.rate * float64(time.Second))
	}
	b.mu.Unlock()
	if wait <= 0 {
		return nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sem is a counting semaphore; a nil sem never blocks.
type sem chan struct{}

func newSem(n int) sem {
	if n <= 0 {
		return nil
	}
	return make(sem, n)
}

func (s sem) acquire(ctx context.Context) error {
	if s == nil {
		return nil
	}
	select {
	case s <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s sem) release() {
	if s != nil {
		<-s
	}
}
