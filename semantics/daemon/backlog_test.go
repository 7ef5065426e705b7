package daemon

import (
	"strings"
	"testing"
	"time"
)

// TestBacklogMeter: registrations completed while others wait are
// measured per second; completions with no backlog say nothing and
// restart the window.
func TestBacklogMeter(t *testing.T) {
	var m backlogMeter
	t0 := time.Unix(0, 0)
	m.tick(t0, true) // opens the window
	for i := 1; i <= 100; i++ {
		m.tick(t0.Add(time.Duration(i)*5*time.Millisecond), true) // 200/s for 500 ms
	}
	if r := m.get(); r < 190 || r > 210 {
		t.Fatalf("rate %.1f, want ≈ 200/s", r)
	}
	before := m.get()
	m.tick(t0.Add(10*time.Second), false) // idle: no sample
	m.tick(t0.Add(20*time.Second), true)  // reopens, no sample yet
	if m.get() != before {
		t.Fatalf("idle ticks changed the rate: %.1f → %.1f", before, m.get())
	}
}

// TestBacklogFull: at the measured rate, a backlog that would take longer
// than registrationQueueWait refuses; an unmeasured rate never does.
func TestBacklogFull(t *testing.T) {
	if err := backlogFull(10000, 0); err != nil {
		t.Fatalf("unmeasured: %v", err)
	}
	if err := backlogFull(399, 100); err != nil { // 3.99 s
		t.Fatalf("399 at 100/s: %v", err)
	}
	err := backlogFull(401, 100) // 4.01 s
	if err == nil || !strings.Contains(err.Error(), "awaiting registration at 100/s") {
		t.Fatalf("401 at 100/s: %v", err)
	}
}
