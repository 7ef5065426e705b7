package relay

import (
	"sync"
	"time"

	"forgeyard.dev/transport/semantics"
)

// pacer orders the relay's writes into one destination connection, a
// small version of the semantics scheduler (semantics/sched.go): writes of
// non-bulk streams (control, heartbeat, ...) never wait and announce
// themselves; bulk streams (log, CAS) write chunks of at most
// DefaultBulkChunk bytes, each after pending non-bulk writes and, when the
// destination backend implements semantics.BulkHinter (yamux), while its
// queue is below the threshold. Every wait is bounded by maxWait, ends when
// the connection closes, and sleeps on a channel or timer.
type pacer struct {
	hinter    semantics.BulkHinter // nil if the backend has none
	threshold int
	maxWait   time.Duration
	closed    <-chan struct{}

	mu     sync.Mutex
	urgent int
	wake   chan struct{} // nil, or closed and cleared when urgent drops to 0
}

const (
	pacerPollMin = 50 * time.Microsecond
	pacerPoll    = time.Millisecond
)

func newPacer(dst semantics.BackendConn, threshold int, maxWait time.Duration) *pacer {
	h, _ := dst.(semantics.BulkHinter)
	return &pacer{hinter: h, threshold: threshold, maxWait: maxWait, closed: dst.Context().Done()}
}

func (p *pacer) beginUrgent() {
	p.mu.Lock()
	p.urgent++
	p.mu.Unlock()
}

func (p *pacer) endUrgent() {
	p.mu.Lock()
	p.urgent--
	if p.urgent == 0 && p.wake != nil {
		close(p.wake)
		p.wake = nil
	}
	p.mu.Unlock()
}

// waitBulk returns when a bulk chunk may be written.
func (p *pacer) waitBulk() {
	var deadline time.Time
	poll := pacerPollMin
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		p.mu.Lock()
		var ch <-chan struct{}
		if p.urgent > 0 {
			if p.wake == nil {
				p.wake = make(chan struct{})
			}
			ch = p.wake
		}
		p.mu.Unlock()
		hint := ch == nil && p.hinter != nil && p.threshold > 0 && p.hinter.QueuedBytes() > p.threshold
		if ch == nil && !hint {
			return
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(p.maxWait)
		}
		left := deadline.Sub(now)
		if left <= 0 {
			return // anti-starvation: the chunk goes anyway
		}
		wait := left
		if hint {
			wait = min(poll, left)
			poll = min(2*poll, pacerPoll)
		}
		if t == nil {
			t = time.NewTimer(wait)
		} else {
			t.Reset(wait)
		}
		select {
		case <-ch: // nil channel when waiting on the hint only
		case <-t.C:
		case <-p.closed:
			return
		}
	}
}
