package relay

import (
	"sync/atomic"
	"testing"
	"time"
)

type fakeHinter struct{ q atomic.Int64 }

func (h *fakeHinter) QueuedBytes() int { return int(h.q.Load()) }

// TestPacerBulkWaitsForControl: a bulk chunk waits while a control write
// is in progress and goes as soon as it ends.
func TestPacerBulkWaitsForControl(t *testing.T) {
	p := &pacer{maxWait: 10 * time.Second, closed: make(chan struct{})}
	tok := p.beginUrgent()
	went := make(chan struct{})
	go func() { p.waitBulk(); close(went) }()
	select {
	case <-went:
		t.Fatal("bulk chunk went while a control write was in progress")
	case <-time.After(50 * time.Millisecond):
	}
	p.endUrgent(tok)
	select {
	case <-went:
	case <-time.After(5 * time.Second):
		t.Fatal("bulk chunk still waiting after the control write ended")
	}
}

// TestPacerHint: a bulk chunk waits while the backend's queue is above
// the threshold, and goes once it drains.
func TestPacerHint(t *testing.T) {
	h := &fakeHinter{}
	h.q.Store(1 << 20)
	p := &pacer{hinter: h, threshold: 64 << 10, maxWait: 10 * time.Second, closed: make(chan struct{})}
	went := make(chan struct{})
	go func() { p.waitBulk(); close(went) }()
	select {
	case <-went:
		t.Fatal("bulk chunk went with the queue above the threshold")
	case <-time.After(50 * time.Millisecond):
	}
	h.q.Store(0)
	select {
	case <-went:
	case <-time.After(5 * time.Second):
		t.Fatal("bulk chunk still waiting after the queue drained")
	}
}

// TestPacerBounded: the wait is bounded by maxWait (no starvation) and
// ends when the connection closes.
func TestPacerBounded(t *testing.T) {
	p := &pacer{maxWait: 30 * time.Millisecond, closed: make(chan struct{})}
	p.beginUrgent()
	start := time.Now()
	p.waitBulk()
	if el := time.Since(start); el < 30*time.Millisecond || el > 5*time.Second {
		t.Fatalf("waited %v, want about maxWait", el)
	}
	// A write in progress for longer than maxWait (stuck on its own
	// stream's flow control) no longer holds bulk back.
	stuck := &pacer{maxWait: 5 * time.Second, closed: make(chan struct{})}
	tok := stuck.beginUrgent()
	stuck.urgent[tok] = time.Now().Add(-6 * time.Second)
	start = time.Now()
	stuck.waitBulk()
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("waited %v behind a write stuck for longer than maxWait", el)
	}
	closed := make(chan struct{})
	p2 := &pacer{maxWait: time.Hour, closed: closed}
	p2.beginUrgent()
	went := make(chan struct{})
	go func() { p2.waitBulk(); close(went) }()
	close(closed)
	select {
	case <-went:
	case <-time.After(5 * time.Second):
		t.Fatal("wait did not end when the connection closed")
	}
}
