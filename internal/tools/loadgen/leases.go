package loadgen

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/internal/stats"
)

// LeaseOptions set the steady lease dispatch.
type LeaseOptions struct {
	// Rate is offers per second across the fleet (0: none).
	Rate float64
	// InFlight bounds the offers waiting for an answer (0: 256); a tick
	// that finds them all busy is counted as skipped.
	InFlight int
}

// Leases offers leases to the registered agents, round robin, at a steady
// rate through the daemon's matrix driver (POST /v1/matrix/offer, which
// answers once the agent accepted: its round trip is the offer→accept
// latency).
type Leases struct {
	d *Daemon
	f *Fleet
	o LeaseOptions

	offered, rejected, failed, skipped atomic.Int64
	wg                                 sync.WaitGroup
	mu                                 sync.Mutex
	lat                                []time.Duration
	accepted                           map[string]bool // attempt ids the agents accepted
}

// NewLeases prepares a dispatcher; Run starts it.
func NewLeases(d *Daemon, f *Fleet, o LeaseOptions) *Leases {
	if o.InFlight <= 0 {
		o.InFlight = 256
	}
	return &Leases{d: d, f: f, o: o, accepted: map[string]bool{}}
}

// Run offers until ctx ends, then waits for the offers in flight.
func (l *Leases) Run(ctx context.Context) {
	defer l.wg.Wait()
	if l.o.Rate <= 0 {
		<-ctx.Done()
		return
	}
	every := time.Duration(float64(time.Second) / l.o.Rate)
	t := time.NewTicker(every)
	defer t.Stop()
	sem := make(chan struct{}, l.o.InFlight)
	runners := l.f.Runners()
	refreshed := time.Now()
	next := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if time.Since(refreshed) > time.Second || len(runners) == 0 {
			runners, refreshed = l.f.Runners(), time.Now()
		}
		if len(runners) == 0 {
			l.skipped.Add(1)
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			l.skipped.Add(1)
			continue
		}
		r := runners[next%len(runners)]
		next++
		l.wg.Go(func() {
			defer func() { <-sem }()
			l.offer(ctx, r.String())
		})
	}
}

func (l *Leases) offer(ctx context.Context, runner string) {
	l.offered.Add(1)
	var out struct{ Job, Lease, Attempt string }
	start := time.Now()
	// Not bound to ctx: an offer the daemon made is awaited to its answer,
	// so the loadgen knows every lease an agent accepted.
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	err := l.d.driverCall(octx, "/v1/matrix/offer", map[string]string{"runner": runner}, &out)
	took := time.Since(start)
	var de *driverError
	switch {
	case err == nil:
		l.mu.Lock()
		l.lat = append(l.lat, took)
		l.accepted[out.Attempt] = true
		l.mu.Unlock()
	case errors.As(err, &de) && de.Status == 409:
		l.rejected.Add(1)
	default:
		l.failed.Add(1)
	}
}

// LeaseStats are the dispatcher's counts.
type LeaseStats struct {
	Offered, Accepted, Rejected, Failed, Skipped int64
	AcceptP50, AcceptP99, AcceptMax              time.Duration
}

// Stats returns the counts and the offer→accept percentiles.
func (l *Leases) Stats() LeaseStats {
	l.mu.Lock()
	lat := sortDurations(l.lat)
	acc := int64(len(l.accepted))
	l.mu.Unlock()
	s := LeaseStats{Offered: l.offered.Load(), Accepted: acc, Rejected: l.rejected.Load(), Failed: l.failed.Load(), Skipped: l.skipped.Load()}
	s.AcceptP50, s.AcceptP99 = stats.Percentile(lat, 50), stats.Percentile(lat, 99)
	if len(lat) > 0 {
		s.AcceptMax = lat[len(lat)-1]
	}
	return s
}

// Accepted returns the attempt ids (strings) the agents accepted.
func (l *Leases) Accepted() map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]bool, len(l.accepted))
	for k := range l.accepted {
		out[k] = true
	}
	return out
}
