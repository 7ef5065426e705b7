package semantics

import (
	"sync"
	"time"
)

// The write scheduler (§45–49, §132). quic-go and yamux have no usable
// stream priorities, so each Conn owns a small fixed scheduler in the spirit
// of x/net/http2's priority write scheduler: fixed classes, urgent traffic on
// its own path.
//
//   - Non-bulk writes (cancel, lease, control) never wait: they announce
//     themselves (beginUrgent) and write at once, concurrently with any bulk
//     chunk already on its way.
//   - Bulk writes (log, CAS) are cut into chunks of at most Limits.BulkChunk
//     bytes. Before each chunk the writer waits while an urgent write is
//     pending or in progress, while a higher bulk class (log before CAS) is
//     waiting or writing, and, if the backend implements BulkHinter, while
//     its QueuedBytes is above the threshold. So a control frame waits
//     behind at most one chunk per bulk stream plus the backend's bounded
//     queue.
//   - An urgent write in progress for longer than the bulk max-wait stops
//     holding bulk back: it is blocked by its own stream's flow control (a
//     peer not reading its control stream), not competing for the link.
//   - Every wait is bounded by the bulk max-wait (anti-starvation: a bulk
//     chunk then goes anyway and the event is counted), ends early when the
//     connection closes or the write deadline passes, and sleeps on a
//     channel or timer — never a busy loop. Only the BulkHinter condition is
//     polled, because backends have no queue-drained event: first after
//     schedPollMin, then at doubling intervals up to schedPoll, so a queue
//     that drains in a fraction of a millisecond (loopback, LAN) does not
//     leave the link idle until a fixed 1 ms poll, and a slow one (WAN) is
//     not read more than about once per millisecond.

// Scheduler defaults.
const (
	// DefaultBulkQueueThreshold is the BulkHinter.QueuedBytes level above
	// which bulk chunks wait (bytes).
	DefaultBulkQueueThreshold = 64 << 10
	// DefaultBulkMaxWait bounds one bulk chunk's wait for higher-priority
	// traffic; after it the chunk is written anyway.
	DefaultBulkMaxWait = 100 * time.Millisecond
	// schedPollMin is a bulk writer's first wait before it re-reads
	// QueuedBytes; each further wait doubles, up to schedPoll.
	schedPollMin = 50 * time.Microsecond
	// schedPoll is the longest wait between two QueuedBytes reads.
	schedPoll = time.Millisecond
)

// SchedStats are the scheduler's counters. Arrays are indexed by Priority.
type SchedStats struct {
	// Queued is the number of bytes currently inside Write calls that have
	// not been handed to the backend yet.
	Queued [NumPriorities]int64
	// Written is the total number of bytes handed to the backend.
	Written [NumPriorities]int64
	// Waits counts bulk chunks that had to wait at least once.
	Waits [NumPriorities]int64
	// WaitTime is the total time bulk chunks spent waiting.
	WaitTime [NumPriorities]time.Duration
	// Forced counts bulk chunks written after DefaultBulkMaxWait (or the
	// configured maximum) although higher-priority traffic was pending.
	Forced [NumPriorities]int64
	// HintWaits counts bulk waits caused by BulkHinter.QueuedBytes.
	HintWaits int64
}

// scheduler orders the writes of one Conn. Safe for concurrent use.
type scheduler struct {
	hinter    BulkHinter // nil if the backend has none
	threshold int
	maxWait   time.Duration

	mu sync.Mutex
	// urgent holds the start time of every non-bulk write in progress. A
	// write older than maxWait no longer holds bulk back: it is stuck on
	// its own stream's flow control, not competing for the link.
	urgent      urgentSet
	urgentSeq   uint64
	bulkWaiting [2]int // by class: 0 log, 1 CAS
	bulkWriting [2]int
	wake        chan struct{} // nil, or closed and cleared on every state change
	stats       SchedStats
	// m mirrors Queued into the observer's queue depths by WriteClass;
	// nil when metrics are off.
	m Observer

	// onWait, if set (tests only), is called each time a bulk writer is
	// about to block.
	onWait func(p Priority)
}

func newScheduler(h BulkHinter, threshold int, maxWait time.Duration) *scheduler {
	return &scheduler{hinter: h, threshold: threshold, maxWait: maxWait}
}

// addQueued adds n (negative to remove) to priority p's queued bytes and
// mirrors it into the queue-depth gauge of p's class. Called with s.mu held.
func (s *scheduler) addQueued(p Priority, n int) {
	s.stats.Queued[p] += int64(n)
	if s.m != nil {
		s.m.QueueAdd(ClassOf(p), n)
	}
}

func (s *scheduler) signalLocked() {
	if s.wake != nil {
		close(s.wake)
		s.wake = nil
	}
}

// waitChanLocked returns the channel signalLocked closes next.
func (s *scheduler) waitChanLocked() <-chan struct{} {
	if s.wake == nil {
		s.wake = make(chan struct{})
	}
	return s.wake
}

// beginUrgent announces a non-bulk write of n bytes and returns its token
// for endUrgent. It never blocks.
func (s *scheduler) beginUrgent(p Priority, n int) uint64 {
	s.mu.Lock()
	s.urgentSeq++
	tok := s.urgentSeq
	s.urgent.add(tok, time.Now())
	s.addQueued(p, n)
	s.mu.Unlock()
	return tok
}

// endUrgent ends the write tok announced with beginUrgent; written bytes
// reached the backend.
func (s *scheduler) endUrgent(tok uint64, p Priority, n, written int) {
	s.mu.Lock()
	s.urgent.remove(tok)
	s.addQueued(p, -n)
	s.stats.Written[p] += int64(written)
	s.signalLocked()
	s.mu.Unlock()
}

// enqueueBulk accounts n bytes of a bulk Write as queued.
func (s *scheduler) enqueueBulk(p Priority, n int) {
	s.mu.Lock()
	s.addQueued(p, n)
	s.mu.Unlock()
}

// dequeueBulk removes n not-yet-written bytes from the queued count (a
// Write that failed part-way).
func (s *scheduler) dequeueBulk(p Priority, n int) {
	s.mu.Lock()
	s.addQueued(p, -n)
	s.mu.Unlock()
}

func bulkIndex(p Priority) int {
	if p == PriorityLog {
		return 0
	}
	return 1
}

// blockedLocked reports whether higher-priority traffic keeps a bulk chunk
// of class p waiting. The BulkHinter condition is checked separately,
// outside the lock.
func (s *scheduler) blockedLocked(p Priority) bool {
	if s.urgent.youngerThan(s.maxWait) {
		return true
	}
	if bulkIndex(p) == 1 && s.bulkWaiting[0]+s.bulkWriting[0] > 0 {
		return true
	}
	return false
}

// urgentSet is the set of non-bulk writes in progress: a few at a time in
// the struct itself, more in a map made only while more are in progress.
// A map kept for the connection's life held ≈ 0.3 KiB per idle agent
// (Go's maps keep their groups after deletes; issue 26 item 1).
type urgentSet struct {
	inline [4]urgentWrite // tok 0: a free slot
	more   map[uint64]time.Time
}

type urgentWrite struct {
	tok   uint64
	start time.Time
}

func (u *urgentSet) add(tok uint64, start time.Time) {
	for i := range u.inline {
		if u.inline[i].tok == 0 {
			u.inline[i] = urgentWrite{tok, start}
			return
		}
	}
	if u.more == nil {
		u.more = make(map[uint64]time.Time)
	}
	u.more[tok] = start
}

func (u *urgentSet) remove(tok uint64) {
	for i := range u.inline {
		if u.inline[i].tok == tok {
			u.inline[i] = urgentWrite{}
			return
		}
	}
	delete(u.more, tok)
	if len(u.more) == 0 {
		u.more = nil
	}
}

// youngerThan reports whether a write in progress started less than d ago.
func (u *urgentSet) youngerThan(d time.Duration) bool {
	var now time.Time
	for i := range u.inline {
		if u.inline[i].tok != 0 {
			if now.IsZero() {
				now = time.Now()
			}
			if now.Sub(u.inline[i].start) < d {
				return true
			}
		}
	}
	for _, t := range u.more {
		if now.IsZero() {
			now = time.Now()
		}
		if now.Sub(t) < d {
			return true
		}
	}
	return false
}

func (s *scheduler) hintOver() bool {
	return s.hinter != nil && s.threshold > 0 && s.hinter.QueuedBytes() > s.threshold
}

// acquireBulk waits until a chunk of class p may be written, then marks it
// in progress; the caller must call releaseBulk. It returns closed's error
// errSchedClosed if closed is closed first, or ErrDeadline if the deadline
// (zero: none) passes. The wait is bounded by s.maxWait.
func (s *scheduler) acquireBulk(p Priority, closed <-chan struct{}, deadline time.Time) error {
	idx := bulkIndex(p)
	var start time.Time
	var maxTimer, dlTimer, pollTimer *time.Timer
	poll := schedPollMin
	defer func() {
		for _, t := range []*time.Timer{maxTimer, dlTimer, pollTimer} {
			if t != nil {
				t.Stop()
			}
		}
	}()
	s.mu.Lock()
	s.bulkWaiting[idx]++
	for {
		blocked := s.blockedLocked(p)
		hint := false
		if !blocked {
			s.mu.Unlock()
			hint = s.hintOver()
			s.mu.Lock()
			blocked = hint || s.blockedLocked(p)
		}
		if !blocked || (!start.IsZero() && time.Since(start) >= s.maxWait) {
			if blocked {
				s.stats.Forced[p]++
			}
			break
		}
		if start.IsZero() {
			start = time.Now()
			s.stats.Waits[p]++
			maxTimer = time.NewTimer(s.maxWait)
			if !deadline.IsZero() {
				dlTimer = time.NewTimer(time.Until(deadline))
			}
		}
		if hint {
			s.stats.HintWaits++
		}
		ch := s.waitChanLocked()
		hook := s.onWait
		s.mu.Unlock()
		if hook != nil {
			hook(p)
		}
		var pollC, dlC <-chan time.Time
		if hint {
			if pollTimer == nil {
				pollTimer = time.NewTimer(poll)
			} else {
				pollTimer.Reset(poll)
			}
			poll = min(2*poll, schedPoll)
			pollC = pollTimer.C
		}
		if dlTimer != nil {
			dlC = dlTimer.C
		}
		var err error
		select {
		case <-ch:
		case <-pollC:
		case <-maxTimer.C:
		case <-dlC:
			err = ErrDeadline
		case <-closed:
			err = errSchedClosed
		}
		s.mu.Lock()
		if err != nil {
			s.bulkWaiting[idx]--
			s.stats.WaitTime[p] += time.Since(start)
			s.signalLocked()
			s.mu.Unlock()
			return err
		}
	}
	s.bulkWaiting[idx]--
	s.bulkWriting[idx]++
	if !start.IsZero() {
		s.stats.WaitTime[p] += time.Since(start)
	}
	s.mu.Unlock()
	return nil
}

// releaseBulk ends a chunk started by acquireBulk: written bytes reached the
// backend, n bytes leave the queue.
func (s *scheduler) releaseBulk(p Priority, n, written int) {
	s.mu.Lock()
	s.bulkWriting[bulkIndex(p)]--
	s.addQueued(p, -n)
	s.stats.Written[p] += int64(written)
	s.signalLocked()
	s.mu.Unlock()
}

func (s *scheduler) snapshot() SchedStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// errSchedClosed is returned by acquireBulk when the connection closed; the
// caller replaces it with the connection's *ConnError.
var errSchedClosed = &ConnError{Code: 0, Reason: "scheduler: connection closed"}
