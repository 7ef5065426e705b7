package semantics

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// The scheduler tests are deterministic: a test hook reports when a bulk
// writer is about to block, and the writer can only proceed on the event
// under test (the max-wait timer is an hour unless the test is about it).

type fakeHinter struct{ q atomic.Int64 }

func (h *fakeHinter) QueuedBytes() int { return int(h.q.Load()) }

func newTestSched(h BulkHinter, maxWait time.Duration) (*scheduler, chan Priority) {
	s := newScheduler(h, DefaultBulkQueueThreshold, maxWait)
	waiting := make(chan Priority, 16)
	s.onWait = func(p Priority) { waiting <- p }
	return s, waiting
}

func acquireAsync(s *scheduler, p Priority, closed <-chan struct{}, dl time.Time) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- s.acquireBulk(p, closed, dl) }()
	return ch
}

func mustBlock(t *testing.T, got <-chan error, waiting <-chan Priority, want Priority) {
	t.Helper()
	select {
	case p := <-waiting:
		if p != want {
			t.Fatalf("%s writer waited, want %s", p, want)
		}
	case err := <-got:
		t.Fatalf("bulk writer did not wait (err %v)", err)
	}
	select {
	case err := <-got:
		t.Fatalf("bulk writer proceeded while blocked: %v", err)
	default:
	}
}

func mustProceed(t *testing.T, got <-chan error) {
	t.Helper()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("acquireBulk: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("bulk writer still blocked")
	}
}

func TestSchedIdleBulkDoesNotWait(t *testing.T) {
	s, _ := newTestSched(nil, time.Hour)
	s.enqueueBulk(PriorityCAS, 100)
	if err := s.acquireBulk(PriorityCAS, nil, time.Time{}); err != nil {
		t.Fatal(err)
	}
	s.releaseBulk(PriorityCAS, 100, 100)
	st := s.snapshot()
	if st.Waits[PriorityCAS] != 0 || st.Written[PriorityCAS] != 100 || st.Queued[PriorityCAS] != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSchedBulkWaitsForUrgent(t *testing.T) {
	for _, p := range []Priority{PriorityCancel, PriorityLease, PriorityControl} {
		for _, b := range []Priority{PriorityLog, PriorityCAS} {
			s, waiting := newTestSched(nil, time.Hour)
			tok := s.beginUrgent(p, 64)
			if q := s.snapshot().Queued[p]; q != 64 {
				t.Fatalf("Queued[%s] = %d, want 64", p, q)
			}
			got := acquireAsync(s, b, nil, time.Time{})
			mustBlock(t, got, waiting, b)
			s.endUrgent(tok, p, 64, 64)
			mustProceed(t, got)
			s.releaseBulk(b, 0, 0)
			st := s.snapshot()
			if st.Waits[b] != 1 || st.Forced[b] != 0 || st.Written[p] != 64 || st.Queued[p] != 0 {
				t.Fatalf("%s/%s stats %+v", p, b, st)
			}
		}
	}
}

func TestSchedUrgentNeverWaitsOnBulk(t *testing.T) {
	s, _ := newTestSched(nil, time.Hour)
	// Bulk chunks of both classes in progress (CAS first: it would wait
	// behind a log chunk).
	for _, b := range []Priority{PriorityCAS, PriorityLog} {
		if err := s.acquireBulk(b, nil, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	// beginUrgent has no blocking path; this would hang if it had one.
	s.endUrgent(s.beginUrgent(PriorityCancel, 1), PriorityCancel, 1, 1)
}

func TestSchedLogBeforeCAS(t *testing.T) {
	s, waiting := newTestSched(nil, time.Hour)
	if err := s.acquireBulk(PriorityLog, nil, time.Time{}); err != nil {
		t.Fatal(err)
	}
	cas := acquireAsync(s, PriorityCAS, nil, time.Time{})
	mustBlock(t, cas, waiting, PriorityCAS)
	// Another log chunk is not held back by the waiting CAS chunk.
	if err := s.acquireBulk(PriorityLog, nil, time.Time{}); err != nil {
		t.Fatal(err)
	}
	s.releaseBulk(PriorityLog, 10, 10)
	select {
	case <-cas:
		t.Fatal("CAS proceeded while a log chunk was still in progress")
	default:
	}
	s.releaseBulk(PriorityLog, 10, 10)
	mustProceed(t, cas)
}

func TestSchedBulkHinter(t *testing.T) {
	h := &fakeHinter{}
	h.q.Store(DefaultBulkQueueThreshold + 1)
	s, waiting := newTestSched(h, time.Hour)
	got := acquireAsync(s, PriorityLog, nil, time.Time{})
	mustBlock(t, got, waiting, PriorityLog)
	h.q.Store(DefaultBulkQueueThreshold) // at the threshold: may go
	mustProceed(t, got)
	if st := s.snapshot(); st.HintWaits == 0 || st.Waits[PriorityLog] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSchedMaxWaitBoundsStarvation(t *testing.T) {
	s, _ := newTestSched(nil, 20*time.Millisecond)
	s.onWait = nil
	s.beginUrgent(PriorityControl, 1) // never ends: stuck on flow control
	start := time.Now()
	if err := s.acquireBulk(PriorityCAS, nil, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 20*time.Millisecond {
		t.Fatalf("forced after %v, before the max wait", el)
	}
	s.releaseBulk(PriorityCAS, 0, 0)
	// At the max wait the chunk goes: counted as forced, or released because
	// the urgent write became stale at the same instant.
	if st := s.snapshot(); st.Waits[PriorityCAS] != 1 || st.Forced[PriorityCAS] > 1 {
		t.Fatalf("stats after the max wait: %+v", st)
	}
	// The stuck urgent write is now older than the max wait: later chunks
	// no longer wait for it.
	if err := s.acquireBulk(PriorityCAS, nil, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if st := s.snapshot(); st.Waits[PriorityCAS] != 1 {
		t.Fatalf("a stale urgent write still holds bulk back: %+v", st)
	}
}

func TestSchedDeadlineAndClose(t *testing.T) {
	s, waiting := newTestSched(nil, time.Hour)
	tok := s.beginUrgent(PriorityControl, 1)
	err := s.acquireBulk(PriorityCAS, nil, time.Now().Add(10*time.Millisecond))
	if !errors.Is(err, ErrDeadline) {
		t.Fatalf("acquireBulk past its deadline: %v", err)
	}
	<-waiting
	closed := make(chan struct{})
	got := acquireAsync(s, PriorityLog, closed, time.Time{})
	mustBlock(t, got, waiting, PriorityLog)
	close(closed)
	if err := <-got; err != errSchedClosed {
		t.Fatalf("acquireBulk after close: %v", err)
	}
	// A failed wait leaves no waiter behind: CAS is not held back by a
	// phantom log writer once the urgent write ends.
	s.endUrgent(tok, PriorityControl, 1, 1)
	if err := s.acquireBulk(PriorityCAS, nil, time.Time{}); err != nil {
		t.Fatal(err)
	}
}
