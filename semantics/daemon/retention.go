package daemon

import (
	"context"
	"time"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/semantics/retention"
	"forgeyard.dev/transport/wire"
)

// Retention configures the garbage collection of the daemon's logs and
// CAS objects ([data.retention]; semantics/retention). The zero value
// collects nothing.
type Retention struct {
	// MaxAge deletes logs and objects older than it; 0: no age limit.
	MaxAge time.Duration
	// MaxBytes deletes the oldest until logs and objects fit; 0: no limit.
	MaxBytes int64
	// Interval between runs, the first one Interval after the start; 0:
	// retention.DefaultInterval.
	Interval time.Duration
	// PartialMaxAge prunes abandoned partial uploads; 0:
	// retention.DefaultPartialMaxAge.
	PartialMaxAge time.Duration
	// Live, when set, adds more attempts and objects to keep. The daemon
	// always keeps what live leases reference: with the SQL authorities
	// (authority.LiveLister) the leases of every daemon sharing the
	// authority, so HA daemons sharing one store keep each other's live
	// attempts' logs and payloads without it; with other authorities
	// those of its own sessions.
	Live retention.LiveSet
}

func (r Retention) enabled() bool { return r.MaxAge > 0 || r.MaxBytes > 0 }

// runRetention collects every Interval until the daemon stops, the first
// time one Interval after the start: a daemon that restarts often (a crash
// loop, a rolling restart of several daemons) does not list the whole
// store each time, and a host or test that collects on demand is not
// raced by a run it did not ask for.
func (d *Daemon) runRetention() {
	defer d.wg.Done()
	iv := d.cfg.Retention.Interval
	if iv <= 0 {
		iv = retention.DefaultInterval
	}
	d.every(iv, func() { d.CollectGarbage(d.ctx) })
}

// CollectGarbage runs the retention policy once (also on the maintenance
// schedule when Config.Retention is set): with an age limit alone, over
// the next page of the content store (retention.Pager: at most
// retention.DefaultPageSize objects per run, every object within one
// cycle of runs), with a size limit over the whole store. It reports the
// run in the metrics
// forgeyard_data_retention_held_bytes and
// forgeyard_data_retention_deleted_bytes_total.
func (d *Daemon) CollectGarbage(ctx context.Context) (retention.Result, error) {
	r := d.cfg.Retention
	sinkC, _ := d.logSink.(logs.Collector)
	storeC, _ := d.cfg.ContentStore.(cas.Collector)
	if sinkC == nil && storeC == nil {
		return retention.Result{}, nil
	}
	pol := retention.Policy{MaxAge: r.MaxAge, MaxBytes: r.MaxBytes, PartialMaxAge: r.PartialMaxAge,
		MinAge: 2 * (d.timing.LeaseTTL + d.timing.RevokeGrace)}
	if pol.PartialMaxAge > 0 && pol.PartialMaxAge < pol.MinAge {
		pol.PartialMaxAge = pol.MinAge // an upload in progress elsewhere is not abandoned
	}
	// One page of the content store per run (retention.Pager): a large
	// bucket is not listed whole every Interval.
	res, err := d.retPager.Collect(ctx, sinkC, storeC, pol, d.liveSet, time.Now())
	m := d.cfg.Metrics
	m.RetentionHeld(StoreLogs, res.LogBytes)
	m.RetentionHeld(StoreCAS, res.CASBytes)
	m.RetentionDeleted(StoreLogs, res.DeletedLogBytes)
	m.RetentionDeleted(StoreCAS, res.DeletedCASBytes)
	if err != nil {
		d.log.Warn("retention run failed", "err", err)
	} else if res.DeletedLogs+res.DeletedObjs+res.PrunedPartials > 0 {
		d.log.Info("retention", "deleted_logs", res.DeletedLogs, "deleted_objects", res.DeletedObjs,
			"deleted_bytes", res.DeletedLogBytes+res.DeletedCASBytes, "pruned_partials", res.PrunedPartials,
			"held_bytes", res.LogBytes+res.CASBytes)
	}
	return res, err
}

// liveSet is what live attempts reference: the offered and accepted
// leases (their attempts' logs, payloads and declared outputs), the
// attempts whose logs this daemon serves, plus Config.Retention.Live.
// With an authority that lists every live lease (authority.LiveLister: the
// SQL stores) the leases are those of every session, held here or by any
// other daemon sharing the authority — what HA daemons sharing one data
// plane must all keep (issue 15 item 5); otherwise those of the sessions
// connected here.
func (d *Daemon) liveSet(ctx context.Context) (retention.Live, error) {
	lv := retention.Live{Attempts: map[wire.JobAttemptId]bool{}, Objects: map[wire.CasObjectRef]bool{}}
	ll := authority.LiveListerOf(d.auth)
	sessions := map[wire.AgentSessionId]bool{}
	d.mu.Lock()
	for a := range d.logConns {
		lv.Attempts[a] = true
	}
	for _, c := range d.conns {
		if _, s, _, _ := c.ident(); ll == nil && s != (wire.AgentSessionId{}) {
			sessions[s] = true
		}
	}
	d.mu.Unlock()
	addLeases := func(ls []authority.Lease) {
		for _, l := range ls {
			lv.Attempts[l.Attempt] = true
			if l.Payload != (wire.CasObjectRef{}) {
				lv.Objects[l.Payload] = true
			}
			d.mu.Lock()
			outs, _ := d.outputs.get(l.Attempt)
			d.mu.Unlock()
			for _, o := range outs {
				lv.Objects[o] = true
			}
		}
	}
	if ll != nil {
		ls, err := ll.LiveLeases(ctx)
		if err != nil {
			return lv, err
		}
		addLeases(ls)
	} else {
		for s := range sessions {
			ls, err := d.auth.SessionLeases(ctx, s, authority.LeaseOffered, authority.LeaseAccepted)
			if err != nil {
				return lv, err
			}
			addLeases(ls)
		}
	}
	if f := d.cfg.Retention.Live; f != nil {
		more, err := f(ctx)
		if err != nil {
			return lv, err
		}
		for a := range more.Attempts {
			lv.Attempts[a] = true
		}
		for o := range more.Objects {
			lv.Objects[o] = true
		}
	}
	return lv, nil
}
