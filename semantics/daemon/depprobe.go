package daemon

import (
	"context"
	"sync"
	"time"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/wire"
)

// Dependency health (issue 27 item 4): a background prober asks the
// authority and the content store, one probe at a time, whether they
// answer, and keeps the result; /healthz and /readyz read it and never
// query a dependency themselves, so a load balancer polling them costs
// the database nothing.

// Probe defaults.
const (
	DefaultProbeInterval = 5 * time.Second
	DefaultProbeTimeout  = time.Second
)

// Dependency names (DependencyHealth.Name).
const (
	DepAuthority   = "authority"
	DepObjectStore = "objstore"
)

// HealthProbe configures the dependency prober. Zero fields take the
// defaults; a negative Interval turns the prober off (the dependencies
// then report the zero DependencyHealth: not probed).
type HealthProbe struct {
	// Interval between the end of one round of probes and the next; 0:
	// DefaultProbeInterval.
	Interval time.Duration
	// Timeout bounds one probe; 0: DefaultProbeTimeout. A probe that
	// takes longer counts as unreachable.
	Timeout time.Duration
}

// DependencyHealth is the last probe of one dependency.
type DependencyHealth struct {
	Name string // DepAuthority, DepObjectStore
	// Configured: the daemon has this dependency (a daemon without a
	// content store has no object store to probe).
	Configured bool
	// Probed: at least one probe finished. Until then Reachable is
	// false and means "not known yet".
	Probed    bool
	Reachable bool
	// Latency is how long the last probe took.
	Latency time.Duration
	// CheckedAt is when the last probe finished.
	CheckedAt time.Time
	// LastError is the error of the last failed probe and LastErrorAt
	// when it happened; both stay after a recovery (when Reachable is true
	// again, they say what the last outage was).
	LastError   string
	LastErrorAt time.Time
	// Since is when Reachable last changed (or the first probe).
	Since time.Time
}

// depProber runs the probes and holds their results.
type depProber struct {
	mu   sync.Mutex
	deps map[string]*DependencyHealth
	// kick asks for a round now (tests, a host after a failover).
	kick chan struct{}
}

// reachabler is a content store with a cheap read-only reachability
// check (cas.FSStore, cas.BucketStore).
type reachabler interface {
	Reachable(ctx context.Context) error
}

// probeAuthority is one authority probe: Ping when the authority has it,
// else the status of the zero runner (a read that changes nothing).
func (d *Daemon) probeAuthority(ctx context.Context) error {
	if p := authority.PingerOf(d.auth); p != nil {
		return p.Ping(ctx)
	}
	_, err := d.auth.RunnerStatus(ctx, wire.RunnerId{})
	return err
}

func (d *Daemon) objectStoreProbe() func(context.Context) error {
	r, ok := d.cfg.ContentStore.(reachabler)
	if !ok {
		return nil
	}
	return r.Reachable
}

func (d *Daemon) startProber() {
	p := &depProber{deps: map[string]*DependencyHealth{
		DepAuthority:   {Name: DepAuthority, Configured: d.auth != nil},
		DepObjectStore: {Name: DepObjectStore, Configured: d.objectStoreProbe() != nil},
	}, kick: make(chan struct{}, 1)}
	d.deps = p
	d.cfg.Metrics.AuthorityUp(false) // registered at 0 until the first probe
	d.cfg.Metrics.ObjectStoreUp(false)
	if d.cfg.HealthProbe.Interval < 0 {
		return
	}
	d.wg.Add(1)
	go d.runProber()
}

// runProber probes every dependency, one at a time, every Interval.
func (d *Daemon) runProber() {
	defer d.wg.Done()
	iv, to := d.cfg.HealthProbe.Interval, d.cfg.HealthProbe.Timeout
	if iv == 0 {
		iv = DefaultProbeInterval
	}
	if to <= 0 {
		to = DefaultProbeTimeout
	}
	probes := []struct {
		name string
		fn   func(context.Context) error
	}{{DepAuthority, d.probeAuthority}, {DepObjectStore, d.objectStoreProbe()}}
	// Not d.every: the first round is at once, a kick starts one early, and
	// the next is one Interval after the round ends, not after it began.
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
		case <-d.deps.kick:
		}
		for _, pr := range probes {
			if pr.fn == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(d.ctx, to)
			start := time.Now()
			err := pr.fn(ctx)
			lat := time.Since(start)
			if err == nil && ctx.Err() != nil {
				err = ctx.Err()
			}
			cancel()
			if d.ctx.Err() != nil {
				return
			}
			d.recordProbe(pr.name, lat, err)
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(iv)
	}
}

func (d *Daemon) recordProbe(name string, lat time.Duration, err error) {
	now := time.Now()
	p := d.deps
	p.mu.Lock()
	h := p.deps[name]
	was, first := h.Reachable, !h.Probed
	h.Probed, h.Reachable, h.Latency, h.CheckedAt = true, err == nil, lat, now
	if err != nil {
		h.LastError, h.LastErrorAt = err.Error(), now
	}
	if first || was != h.Reachable {
		h.Since = now
	}
	cur := *h
	p.mu.Unlock()
	switch name {
	case DepAuthority:
		d.cfg.Metrics.AuthorityUp(cur.Reachable)
	case DepObjectStore:
		d.cfg.Metrics.ObjectStoreUp(cur.Reachable)
	}
	switch {
	case !cur.Reachable && (first || was):
		d.log.Warn(name+" unreachable", "err", cur.LastError, "probe_latency", lat.Round(time.Microsecond))
	case cur.Reachable && !first && !was:
		d.log.Info(name+" reachable again", "probe_latency", lat.Round(time.Microsecond))
	}
}

// Dependencies returns the last probe of the authority and of the object
// store (the content store), in that order: cached state, cheap enough
// for every /healthz and /readyz request.
func (d *Daemon) Dependencies() []DependencyHealth {
	p := d.deps
	p.mu.Lock()
	defer p.mu.Unlock()
	return []DependencyHealth{*p.deps[DepAuthority], *p.deps[DepObjectStore]}
}

// ProbeDependencies asks the prober for a round of probes now, without
// waiting for it (a no-op while one runs or with the prober off).
func (d *Daemon) ProbeDependencies() {
	select {
	case d.deps.kick <- struct{}{}:
	default:
	}
}
