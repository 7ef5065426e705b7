package agent

import (
	"math/rand/v2"
	"time"
)

// maxBusyBackoff caps the wait between retries of a message the daemon
// answered RetryBackoff (its authority or data store is unavailable): an
// outage of the daemon's database is short next to a reconnect, and the
// message is retried soon after it ends.
const maxBusyBackoff = 5 * time.Second

// busyBackoff is the full-jitter wait before the n-th consecutive retry of
// a message answered RetryBackoff: uniform in [0, min(maxBusyBackoff,
// Backoff.Max, Backoff.Base·2ⁿ)].
func (a *Agent) busyBackoff(n int) time.Duration {
	a.mu.Lock()
	ceiling := min(a.maxBackoff, maxBusyBackoff)
	a.mu.Unlock()
	return fullJitter(a.cfg.Backoff.Base, ceiling, n, rand.Int64N)
}
