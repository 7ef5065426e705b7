package cas

import (
	"context"
	"time"

	"forgeyard.dev/transport/semantics/internal/tokenbucket"
)

// Bandwidth is a token bucket (§134, §269) shared by every transfer that
// uses it: at most Rate bytes per second on average, bursts of at most
// Burst bytes (the module's one token bucket, semantics/internal/
// tokenbucket). A nil *Bandwidth is unlimited. Safe for concurrent use.
type Bandwidth struct {
	b *tokenbucket.Bucket // may go into debt: reserved bytes
}

// NewBandwidth returns a bucket of rate bytes per second and burst bytes
// (burst ≤ 0 means rate/10, at least 64 KiB). rate ≤ 0 returns nil
// (unlimited).
func NewBandwidth(rate int64, burst int) *Bandwidth {
	if rate <= 0 {
		return nil
	}
	if burst <= 0 {
		burst = int(max(rate/10, 64<<10))
	}
	return &Bandwidth{b: tokenbucket.New(float64(rate), burst)}
}

// Wait takes n bytes of budget, waiting until the bucket allows them or
// ctx ends (ctx's error; the budget stays taken). n may exceed the burst.
func (b *Bandwidth) Wait(ctx context.Context, n int) error {
	if b == nil || n <= 0 {
		return nil
	}
	wait := b.b.Reserve(time.Now(), n)
	if wait <= 0 {
		return nil
	}
	if !tokenbucket.Sleep(ctx, wait) {
		return ctx.Err()
	}
	return nil
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
