package telemetry

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"forgeyard.dev/transport/semantics/internal/tokenbucket"
)

// AuditLimiter bounds the audit records of one noisy source (e.g. failed
// TLS handshakes, which any host on the network can cause) with a token
// bucket (semantics/internal/tokenbucket): at most Burst records at once
// and Rate per second sustained.
// Records over the limit are counted, not written: the next record written
// carries the count in its "suppressed" attribute, and when no record
// follows within a second of the last suppression, a summary record (level
// Warn, message "audit suppressed", attributes event and suppressed) is
// written instead, so the count is never lost. Close writes any pending
// count. It is safe for concurrent use; a nil *AuditLimiter drops records.
type AuditLimiter struct {
	a   *Audit
	log *slog.Logger

	bucket *tokenbucket.Bucket // records; taken under mu
	now    func() time.Time
	after  func(time.Duration, func()) *time.Timer

	mu         sync.Mutex
	suppressed int64       // dropped since the last record; guarded by mu
	event      AuditEvent  // event of the suppressed records; guarded by mu
	timer      *time.Timer // pending summary; guarded by mu
	closed     bool        // guarded by mu
	total      int64       // every suppressed record; guarded by mu

	summaryLag time.Duration // delay of the summary record
}

// Default audit limits for failed handshakes.
const (
	DefaultAuditRate  = 10 // records per second
	DefaultAuditBurst = 20
)

// NewAuditLimiter returns a limiter writing through a (and log, the
// logger a writes to, for the summary records; slog.Default() when nil)
// at rate records per second with burst (≤ 0: DefaultAuditRate,
// DefaultAuditBurst).
func NewAuditLimiter(a *Audit, log *slog.Logger, rate float64, burst int) *AuditLimiter {
	if rate <= 0 {
		rate = DefaultAuditRate
	}
	if burst <= 0 {
		burst = DefaultAuditBurst
	}
	if log == nil {
		log = slog.Default()
	}
	return &AuditLimiter{a: a, log: log, bucket: tokenbucket.New(rate, burst),
		now: time.Now, after: time.AfterFunc, summaryLag: time.Second}
}

// Emit writes event with attrs through the Audit when the limit allows
// (adding the suppressed count when records were dropped before it) and
// reports whether it did; otherwise it counts the record as suppressed.
func (l *AuditLimiter) Emit(ctx context.Context, event AuditEvent, attrs ...AuditAttr) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	if l.closed || !l.take() {
		l.suppressed++
		l.total++
		l.event = event
		if l.timer == nil && !l.closed {
			l.timer = l.after(l.summaryLag, l.flush)
		}
		l.mu.Unlock()
		return false
	}
	n := l.suppressed
	l.suppressed = 0
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	l.mu.Unlock()
	if n > 0 {
		attrs = append(attrs, Suppressed(n))
	}
	l.a.Emit(ctx, event, attrs...)
	return true
}

// take takes a token at l.now().
func (l *AuditLimiter) take() bool {
	ok, _ := l.bucket.Take(l.now())
	return ok
}

// flush writes the summary of records suppressed since the last record.
func (l *AuditLimiter) flush() {
	l.mu.Lock()
	n, ev := l.suppressed, l.event
	l.suppressed, l.timer = 0, nil
	l.mu.Unlock()
	if n > 0 {
		l.log.LogAttrs(context.Background(), slog.LevelWarn, "audit suppressed",
			slog.String(AuditKeyEvent, ev.String()), slog.Int64(AuditKeySuppressed, n))
	}
}

// Suppressed returns how many records the limiter dropped in total.
func (l *AuditLimiter) Suppressed() int64 {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// Close writes the pending suppressed count, if any, and stops the
// limiter: later records are only counted. Idempotent.
func (l *AuditLimiter) Close() {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.closed = true
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	l.mu.Unlock()
	l.flush()
}
