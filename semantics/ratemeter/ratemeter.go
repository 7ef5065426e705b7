// Package ratemeter measures the rate at which a bounded resource is
// given back while others wait for it: handshake slots in backends/quic's
// admission, registrations in semantics/daemon's backlog. Both refuse new
// work by the wait the measured rate predicts, so the rate must be the one
// the process achieves under load, not its idle rate: only windows in
// which a backlog existed count. It imports only the standard library so
// that a backend and an engine can share it (semantics/internal is closed
// to backends). Not part of the stable API (docs/api.md).
package ratemeter

import (
	"sync"
	"time"
)

// Window is the shortest measuring window.
const Window = 250 * time.Millisecond

// Meter measures events per second over windows of at least Window in
// which a backlog existed, smoothed (an EWMA: 0.7 of the old figure, 0.3
// of the new window's). Windows without a backlog say nothing of the rate
// and restart the window; the figure is kept. The zero value is ready and
// has measured nothing (Rate 0). Safe for concurrent use.
type Meter struct {
	mu    sync.Mutex
	start time.Time
	n     int
	rate  float64
}

// Tick records one event at now; busy reports whether others were
// waiting when it happened (the backlog that makes it a sample).
func (m *Meter) Tick(now time.Time, busy bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !busy { // the window closes without a sample
		m.start, m.n = time.Time{}, 0
		return
	}
	if m.start.IsZero() { // the first event of a busy spell opens a window
		m.start, m.n = now, 0
		return
	}
	m.n++
	if d := now.Sub(m.start); d >= Window {
		r := float64(m.n) / d.Seconds()
		if m.rate == 0 {
			m.rate = r
		} else {
			m.rate = 0.7*m.rate + 0.3*r
		}
		m.start, m.n = now, 0
	}
}

// Rate returns the measured events per second, 0 until a window closed.
func (m *Meter) Rate() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rate
}

// Set replaces the measured rate (a test's, or a prior from elsewhere).
func (m *Meter) Set(perSecond float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rate = perSecond
}
