package ratemeter

import (
	"testing"
	"time"
)

// TestMeter: events while others wait are measured per second; events
// with no backlog say nothing and restart the window (the figure stays);
// a new busy spell's first event opens a window without a sample, so an
// idle gap is never one slow sample.
func TestMeter(t *testing.T) {
	var m Meter
	if m.Rate() != 0 {
		t.Fatalf("zero Meter rate %.1f", m.Rate())
	}
	t0 := time.Unix(1000, 0)
	m.Tick(t0, true) // opens the window
	for i := 1; i <= 100; i++ {
		m.Tick(t0.Add(time.Duration(i)*5*time.Millisecond), true) // 200/s for 500 ms
	}
	if r := m.Rate(); r < 190 || r > 210 {
		t.Fatalf("rate %.1f, want ≈ 200/s", r)
	}
	before := m.Rate()
	m.Tick(t0.Add(10*time.Second), false) // idle: no sample
	m.Tick(t0.Add(20*time.Second), true)  // reopens, no sample yet
	if m.Rate() != before {
		t.Fatalf("idle ticks changed the rate: %.1f → %.1f", before, m.Rate())
	}
	// A slower spell of two windows moves the figure by the EWMA's 0.3
	// twice: 0.49 of the old figure, 0.51 of the new rate.
	for i := 1; i <= 50; i++ {
		m.Tick(t0.Add(20*time.Second+time.Duration(i)*10*time.Millisecond), true) // 100/s for 500 ms
	}
	if r, want := m.Rate(), 0.49*before+0.51*100; r < want-5 || r > want+5 {
		t.Fatalf("rate after a 100/s spell %.1f, want ≈ %.1f", r, want)
	}
	m.Set(42)
	if m.Rate() != 42 {
		t.Fatalf("Set(42): rate %.1f", m.Rate())
	}
}
