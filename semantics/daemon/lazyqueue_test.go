package daemon

import (
	"sync"
	"testing"
)

// TestLazyQueue: functions run in push order, a full queue makes push
// wait, a closed abort gives up, and a drained queue holds neither
// goroutine nor channel (issue 26 item 1).
func TestLazyQueue(t *testing.T) {
	var l lazyQueue
	if !l.idle() {
		t.Fatal("zero queue not idle")
	}
	const n = 1000
	var mu sync.Mutex
	var got []int
	for i := range n {
		if !l.push(4, func() { mu.Lock(); got = append(got, i); mu.Unlock() }, nil) {
			t.Fatal("push without abort failed")
		}
	}
	l.wait()
	if len(got) != n {
		t.Fatalf("ran %d of %d", len(got), n)
	}
	for i, v := range got {
		if v != i {
			t.Fatalf("position %d ran %d: out of order", i, v)
		}
	}
	if !l.idle() {
		t.Fatal("drained queue still holds its goroutine or channel")
	}

	// Back-pressure: with the drain blocked in its first function and one
	// slot queued, a push waits until abort closes.
	release := make(chan struct{})
	started := make(chan struct{})
	l.push(1, func() { close(started); <-release }, nil)
	<-started
	l.push(1, func() {}, nil) // fills the one slot
	abort := make(chan struct{})
	close(abort)
	if l.push(1, func() { t.Error("aborted function ran") }, abort) {
		t.Fatal("push into a full queue with a closed abort succeeded")
	}
	close(release)
	l.wait()
	if !l.idle() {
		t.Fatal("queue not idle after the blocked drain finished")
	}
}
