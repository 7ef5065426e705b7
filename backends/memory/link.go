package memory

import (
	"sync"
	"time"
)

// pair is the state shared by the two ends of one connection. One mutex
// guards everything below it, including every stream half of the pair: the
// backend is for tests, and a single lock keeps the cross-end state
// transitions (reset, stop, close) simple and deadlock-free.
type pair struct {
	mu   sync.Mutex
	opts Options

	ends [2]*Conn // client, server
	// links[i] carries events sent by ends[i] to the other end.
	links [2]*link

	bytes, writes int64 // totals sent, both directions (cut accounting)

	done     chan struct{} // closed when both ends are closed
	doneOnce bool
}

// event is one delivery on a link: applied under pair.mu at time at.
type event struct {
	at time.Time
	n  int // data bytes (for QueuedBytes)
	fn func()
}

// link is one direction of a pair. Without latency or bandwidth limits it
// applies events synchronously; otherwise a goroutine applies them in order
// at their delivery time. Guarded by pair.mu.
type link struct {
	p       *pair
	delayed bool
	q       []event
	queued  int // data bytes in q
	nextTx  time.Time
	lastAt  time.Time
	kick    chan struct{} // buffered 1: wakes the delivery goroutine
}

func newLink(p *pair) *link {
	l := &link{p: p, delayed: p.opts.Latency > 0 || p.opts.Bandwidth > 0}
	if l.delayed {
		l.kick = make(chan struct{}, 1)
		go l.run()
	}
	return l
}

// send schedules fn (applied under pair.mu) after n bytes were transmitted
// and the latency elapsed. The caller holds pair.mu. With bandwidth pacing
// it returns the time until which the writer must wait (its bytes left the
// send buffer); otherwise the zero time.
func (l *link) send(n int, fn func()) time.Time {
	if !l.delayed {
		fn()
		return time.Time{}
	}
	now := time.Now()
	tx := now
	if l.nextTx.After(tx) {
		tx = l.nextTx
	}
	if bw := l.p.opts.Bandwidth; bw > 0 && n > 0 {
		tx = tx.Add(time.Duration(float64(n) / float64(bw) * float64(time.Second)))
	}
	l.nextTx = tx
	at := tx.Add(l.p.opts.Latency)
	if at.Before(l.lastAt) {
		at = l.lastAt
	}
	l.lastAt = at
	l.q = append(l.q, event{at: at, n: n, fn: fn})
	l.queued += n
	select {
	case l.kick <- struct{}{}:
	default:
	}
	if bw := l.p.opts.Bandwidth; bw > 0 {
		// The writer may continue once the untransmitted backlog fits in
		// the send buffer.
		return tx.Add(-time.Duration(float64(l.p.opts.SendBuffer) / float64(bw) * float64(time.Second)))
	}
	return time.Time{}
}

// run delivers queued events until the pair is done.
func (l *link) run() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		l.p.mu.Lock()
		for len(l.q) > 0 && !time.Now().Before(l.q[0].at) {
			ev := l.q[0]
			l.q[0] = event{}
			l.q = l.q[1:]
			l.queued -= ev.n
			ev.fn()
		}
		pending := len(l.q) > 0
		var wait time.Duration
		if pending {
			wait = max(time.Until(l.q[0].at), 0)
		}
		l.p.mu.Unlock()
		var tc <-chan time.Time
		if pending {
			timer.Reset(wait)
			tc = timer.C
		}
		select {
		case <-l.p.done:
			return
		case <-l.kick:
		case <-tc:
		}
		if tc != nil && !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// drop discards undelivered events (a cut). Caller holds pair.mu.
func (l *link) drop() {
	l.q = nil
	l.queued = 0
}

// markDone closes p.done once both ends are closed. Caller holds p.mu.
func (p *pair) markDone() {
	if p.doneOnce {
		return
	}
	if p.ends[0].err != nil && p.ends[1].err != nil {
		p.doneOnce = true
		close(p.done)
	}
}

// waitLocked releases p.mu, waits for ch, the deadline dl (if non-zero) or
// extra (if non-nil), and re-acquires p.mu. It reports whether dl passed.
func (p *pair) waitLocked(ch <-chan struct{}, dl time.Time, extra <-chan struct{}) {
	p.mu.Unlock()
	defer p.mu.Lock()
	var tc <-chan time.Time
	if !dl.IsZero() {
		t := time.NewTimer(time.Until(dl))
		defer t.Stop()
		tc = t.C
	}
	select {
	case <-ch:
	case <-tc:
	case <-extra:
	}
}

// sleepUntil waits (without p.mu) until t or until end is closed.
func sleepUntil(t time.Time, end <-chan struct{}) {
	d := time.Until(t)
	if d <= 0 {
		return
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-end:
	}
}
