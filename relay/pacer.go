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
// the connection closes, and sleeps on a channel or timer; a non-bulk write
// in progress for longer than maxWait (stuck on its own stream's flow
// control) stops holding bulk back.
type pacer struct {
	hinter    semantics.BulkHinter // nil if the backend has none
	threshold int
	maxWait   time.Duration
	closed    <-chan struct{}

	mu     sync.Mutex
	urgent map[uint64]time.Time // start of every non-bulk write in progress
	seq    uint64
	wake   chan struct{} // nil, or closed and cleared when a non-bulk write ends
}

const (
	pacerPollMin = 50 * time.Microsecond
	pacerPoll    = time.Millisecond
)

func newPacer(dst semantics.BackendConn, threshold int, maxWait time.Duration) *pacer {
	h, _ := dst.(semantics.BulkHinter)
	return &pacer{hinter: h, threshold: threshold, maxWait: maxWait, closed: dst.Context().Done()}
}

// beginUrgent announces a non-bulk write; pass its token to endUrgent.
func (p *pacer) beginUrgent() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.urgent == nil {
		p.urgent = make(map[uint64]time.Time)
	}
	p.seq++
	p.urgent[p.seq] = time.Now()
	return p.seq
}

func (p *pacer) endUrgent(tok uint64) {
	p.mu.Lock()
	delete(p.urgent, tok)
	if p.wake != nil {
		close(p.wake)
		p.wake = nil
	}
	p.mu.Unlock()
}

// blockingLocked returns how long the youngest non-bulk write in progress
// still holds bulk back: a write older than maxWait is stuck on its own
// stream's flow control (a peer not reading it), not competing for the
// link, and no longer holds bulk back. 0: nothing holds it back.
func (p *pacer) blockingLocked(now time.Time) time.Duration {
	var hold time.Duration
	for _, t := range p.urgent {
		if left := p.maxWait - now.Sub(t); left > hold {
			hold = left
		}
	}
	return hold
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
		now := time.Now()
		p.mu.Lock()
		var ch <-chan struct{}
		hold := p.blockingLocked(now)
		if hold > 0 {
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
		if deadline.IsZero() {
			deadline = now.Add(p.maxWait)
		}
		left := deadline.Sub(now)
		if left <= 0 {
			return // anti-starvation: the chunk goes anyway
		}
		wait := min(left, hold)
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
