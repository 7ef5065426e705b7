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
	"sync"
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
	// ListedObjects is how many objects the run listed: all of them
	// (Collect) or one page (Pager).
	ListedObjects int
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
	var objects func(func(cas.ObjectInfo) error) error
	if store != nil {
		objects = store.Objects
	}
	return collect(ctx, sink, store, objects, p, live, now)
}

// collect runs the policy over sink and the objects objects lists (of
// store).
func collect(ctx context.Context, sink logs.Collector, store cas.Collector, objects func(func(cas.ObjectInfo) error) error,
	p Policy, live LiveSet, now time.Time) (Result, error) {
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
	if objects != nil {
		if err := objects(func(o cas.ObjectInfo) error {
			items = append(items, item{ref: o.Ref, size: int64(o.Ref.Size), at: o.Stored})
			res.ListedObjects++
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

// DefaultPageSize is how many objects a Pager lists per run.
const DefaultPageSize = 10000

// Pager runs the policy over one page of the content store per run
// instead of the whole store: it walks the store's shards (cas.NumShards
// digest prefixes, cas.ShardCollector) in order with a cursor kept from
// one run to the next, listing at most PageSize objects per run, so a
// bucket of N objects is listed once every ceil(N/PageSize) runs (plus
// one per cycle for the page a cycle ends on) rather than on every run.
// Every object that exists through a whole cycle is visited in it.
//
// Paging applies to the age limit (MaxAge) and to partial uploads; a
// policy with MaxBytes needs the store's total and its oldest objects,
// so it, and a store that is not a cas.ShardCollector, is run by Collect
// over the whole store. Logs are listed whole every run. Result's
// CASBytes is then the bytes of the objects kept in the last complete
// cycle, counted shard by shard (0 until a first cycle ends).
//
// A Pager is safe for concurrent use (runs are serialized).
type Pager struct {
	// PageSize bounds the objects listed per run; 0: DefaultPageSize.
	PageSize int

	mu      sync.Mutex
	shard   int    // the shard the next run starts in
	after   string // the last digest listed in that shard ("" for none)
	running int64  // bytes kept so far in the current shard
	held    [cas.NumShards]int64
	cycles  int // complete passes over every shard
}

// errPageFull ends a page's listing.
var errPageFull = errors.New("retention: page full")

// Cycles reports how many times the pager has gone over every shard.
func (pg *Pager) Cycles() int {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	return pg.cycles
}

// Collect runs the policy once: over one page of store when it can page
// (see Pager), else like the package's Collect.
func (pg *Pager) Collect(ctx context.Context, sink logs.Collector, store cas.Collector, p Policy, live LiveSet, now time.Time) (Result, error) {
	sc, ok := store.(cas.ShardCollector)
	if !ok || p.MaxBytes > 0 {
		return Collect(ctx, sink, store, p, live, now)
	}
	pg.mu.Lock()
	defer pg.mu.Unlock()
	size := pg.PageSize
	if size <= 0 {
		size = DefaultPageSize
	}
	// The page: from the cursor, shard after shard, until size objects
	// are listed or the cycle ends.
	type pos struct {
		shard int
		after string
	}
	var page []cas.ObjectInfo
	cur := pos{pg.shard, pg.after}
	var sizes []int // objects listed per shard of the page, in order
	var shards []int
	endCycle := false
	for len(page) < size {
		n := 0
		err := sc.ShardObjects(cur.shard, cur.after, func(o cas.ObjectInfo) error {
			if len(page) >= size {
				return errPageFull
			}
			page = append(page, o)
			n++
			return ctx.Err()
		})
		if err != nil && !errors.Is(err, errPageFull) {
			return Result{}, err
		}
		shards, sizes = append(shards, cur.shard), append(sizes, n)
		if errors.Is(err, errPageFull) {
			if n > 0 {
				cur.after = page[len(page)-1].Ref.Digest.String()
			}
			break
		}
		cur = pos{cur.shard + 1, ""}
		if cur.shard == cas.NumShards {
			cur.shard, endCycle = 0, true
			break
		}
	}
	rec := &recordingStore{Collector: store, deleted: map[wire.CasObjectRef]bool{}}
	res, err := collect(ctx, sink, rec, func(fn func(cas.ObjectInfo) error) error {
		for _, o := range page {
			if err := fn(o); err != nil {
				return err
			}
		}
		return nil
	}, p, live, now)
	if err != nil && res.ListedObjects == 0 && len(page) > 0 {
		return res, err // nothing was examined (no live set): the cursor stays
	}
	// Account the kept bytes shard by shard and move the cursor.
	i := 0
	for k, sh := range shards {
		for _, o := range page[i : i+sizes[k]] {
			if !rec.deleted[o.Ref] {
				pg.running += int64(o.Ref.Size)
			}
		}
		i += sizes[k]
		if k < len(shards)-1 || cur.shard != sh { // the shard was listed to its end
			pg.held[sh] = pg.running
			pg.running = 0
		}
	}
	pg.shard, pg.after = cur.shard, cur.after
	if endCycle {
		pg.cycles++
	}
	var held int64
	for _, b := range pg.held {
		held += b
	}
	res.CASBytes = held
	return res, err
}

// recordingStore records the objects deleted through it.
type recordingStore struct {
	cas.Collector
	deleted map[wire.CasObjectRef]bool
}

func (r *recordingStore) Delete(ref wire.CasObjectRef) error {
	err := r.Collector.Delete(ref)
	if err == nil {
		r.deleted[ref] = true
	}
	return err
}
