// Package retention garbage-collects a daemon's logs and CAS objects by
// policy (issue 15 item 5): everything older than MaxAge, then the oldest
// until logs and objects together fit in MaxBytes, never what a live
// attempt references (its log, its payload, its declared outputs), and
// abandoned partial uploads older than PartialMaxAge. It works on any
// logs.Collector and cas.Collector: FileSink/FSStore and
// BucketSink/BucketStore alike.
package retention

import (
	"context"
	"errors"
	"sort"
	"time"

	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/wire"
)

// Defaults.
const (
	DefaultInterval      = 10 * time.Minute
	DefaultPartialMaxAge = 24 * time.Hour
)

// Policy says what to keep. A zero MaxAge and MaxBytes keep everything
// (only partial uploads are pruned).
type Policy struct {
	MaxAge        time.Duration // 0: no age limit
	MaxBytes      int64         // 0: no size limit
	PartialMaxAge time.Duration // 0: DefaultPartialMaxAge
	// MinAge protects everything written more recently from the size
	// limit (an attempt that just ended, or one live on another daemon
	// whose LiveSet this daemon cannot see); 0: none.
	MinAge time.Duration
}

// Enabled reports whether the policy deletes anything but partials.
func (p Policy) Enabled() bool { return p.MaxAge > 0 || p.MaxBytes > 0 }

// Live is what must be kept.
type Live struct {
	Attempts map[wire.JobAttemptId]bool
	Objects  map[wire.CasObjectRef]bool
}

// LiveSet returns the attempts and objects live attempts reference. With
// HA daemons sharing a store it must cover every daemon's attempts (an
// authority query); a daemon alone knows its own.
type LiveSet func(ctx context.Context) (Live, error)

// Result reports one collection.
type Result struct {
	LogBytes, CASBytes               int64 // held after the run
	DeletedLogs, DeletedObjs         int
	DeletedLogBytes, DeletedCASBytes int64
	PrunedPartials                   int
}

type item struct {
	log  bool
	a    wire.JobAttemptId
	ref  wire.CasObjectRef
	size int64
	at   time.Time
}

// Collect runs the policy once over sink and store (either may be nil).
func Collect(ctx context.Context, sink logs.Collector, store cas.Collector, p Policy, live LiveSet, now time.Time) (Result, error) {
	var res Result
	var lv Live
	if live != nil {
		var err error
		if lv, err = live(ctx); err != nil {
			// Without the live set nothing may be deleted safely.
			return res, err
		}
	}
	var items []item
	if sink != nil {
		if err := sink.Logs(func(l logs.AttemptLog) error {
			items = append(items, item{log: true, a: l.Attempt, size: l.Bytes, at: l.Modified})
			return ctx.Err()
		}); err != nil {
			return res, err
		}
	}
	if store != nil {
		if err := store.Objects(func(o cas.ObjectInfo) error {
			items = append(items, item{ref: o.Ref, size: int64(o.Ref.Size), at: o.Stored})
			return ctx.Err()
		}); err != nil {
			return res, err
		}
	}
	var errs []error
	del := func(it item) bool {
		var err error
		if it.log {
			err = sink.DeleteLog(it.a)
		} else {
			err = store.Delete(it.ref)
		}
		if err != nil {
			errs = append(errs, err)
			return false
		}
		if it.log {
			res.DeletedLogs++
			res.DeletedLogBytes += it.size
		} else {
			res.DeletedObjs++
			res.DeletedCASBytes += it.size
		}
		return true
	}
	kept := func(it item) bool {
		if it.log {
			return lv.Attempts[it.a]
		}
		return lv.Objects[it.ref]
	}
	var rest []item
	var total int64
	for _, it := range items {
		if p.MaxAge > 0 && now.Sub(it.at) > p.MaxAge && !kept(it) && del(it) {
			continue
		}
		rest = append(rest, it)
		total += it.size
	}
	if p.MaxBytes > 0 && total > p.MaxBytes {
		sort.SliceStable(rest, func(i, j int) bool { return rest[i].at.Before(rest[j].at) })
		out := rest[:0]
		for _, it := range rest {
			if total > p.MaxBytes && !kept(it) && (p.MinAge <= 0 || now.Sub(it.at) > p.MinAge) && del(it) {
				total -= it.size
				continue
			}
			out = append(out, it)
		}
		rest = out
	}
	for _, it := range rest {
		if it.log {
			res.LogBytes += it.size
		} else {
			res.CASBytes += it.size
		}
	}
	if store != nil {
		age := p.PartialMaxAge
		if age <= 0 {
			age = DefaultPartialMaxAge
		}
		n, err := store.PrunePartials(age)
		res.PrunedPartials = n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return res, errors.Join(errs...)
}
