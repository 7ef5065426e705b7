package soak

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/wire"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// Fault kinds, as counted in the report.
const (
	fCut              = "connection_cut"       // the agent's connection cut (memory cut, abrupt close)
	fCancel           = "cancel"               // a deliberate cancel
	fDupCancel        = "duplicate_cancel"     // extra copies of a cancel (concurrent and after the end)
	fEarlyCancel      = "cancel_before_accept" // a cancel recorded while the offer is still unanswered (reordered)
	fDupOffer         = "duplicate_offer"      // AcceptLease held past the offer re-send period: the offer is re-sent
	fAuthErrBefore    = "authority_error"      // an authority call fails without effect (retryable)
	fAuthErrAfter     = "authority_error_after_commit"
	fAuthLatency      = "authority_latency"
	fCrash            = "daemon_crash_restart"
	fClockStep        = "clock_step"
	fDupCompletionObs = "completion_retried" // observed: agent completion re-sends (after cuts, crashes, errors)
)

var faultOrder = []string{fCut, fCancel, fDupCancel, fEarlyCancel, fDupOffer, fAuthErrBefore, fAuthErrAfter, fAuthLatency, fCrash, fClockStep}

// authOp names the authority calls the decorator can fail or delay.
type authOp uint8

const (
	opNone authOp = iota
	opCreate
	opAccept
	opRenew
	opComplete
)

func (o authOp) String() string {
	return [...]string{"none", "CreateLease", "AcceptLease", "RenewLease", "CompleteAttempt"}[o]
}

// plan is what the schedule does to one lifecycle. It is a pure function
// of (seed, index, faults on).
type plan struct {
	Index   int
	Lines   int           // stdout lines the executor writes
	OutSize int           // bytes of its one output
	Run     time.Duration // how long it runs after logging

	Cancel       bool // the harness cancels it (the executor waits for the cancel)
	CancelCopies int  // CancelAttempt calls (>1: duplicates)
	CancelEarly  bool // cancel as soon as the lease is recorded, racing the offer

	Cut      bool
	CutAfter time.Duration // from the offer

	AuthOp    authOp
	AuthFails int  // calls of AuthOp for this attempt that fail
	AuthAfter bool // the failing call commits first (the caller sees an error anyway)
	AuthDelay time.Duration
	DupOffer  bool // AcceptLease held past the offer re-send period

	Crash     bool          // the daemon crashes once this lifecycle's offer is answered
	ClockStep time.Duration // the daemon clock steps by this once the offer is answered
}

// makePlan derives lifecycle idx's plan. forceCrash/forceClock make sure a
// short run still injects every kind.
func makePlan(seed uint64, idx int, faults, forceCrash, forceClock bool, skip map[string]bool) plan {
	p := makePlanAll(seed, idx, faults, forceCrash, forceClock)
	if skip[fCut] {
		p.Cut = false
	}
	if skip[fCancel] {
		p.Cancel, p.CancelCopies, p.CancelEarly = false, 0, false
	}
	if skip[fDupCancel] && p.CancelCopies > 1 {
		p.CancelCopies = 1
	}
	if skip[fEarlyCancel] {
		p.CancelEarly = false
	}
	if skip[fDupOffer] {
		p.DupOffer = false
	}
	if (skip[fAuthErrBefore] && p.AuthFails > 0 && !p.AuthAfter) || (skip[fAuthErrAfter] && p.AuthAfter) || (skip[fAuthLatency] && p.AuthDelay > 0) {
		p.AuthOp, p.AuthFails, p.AuthAfter, p.AuthDelay = opNone, 0, false, 0
	}
	if skip[fCrash] {
		p.Crash = false
	}
	if skip[fClockStep] {
		p.ClockStep = 0
	}
	return p
}

func makePlanAll(seed uint64, idx int, faults, forceCrash, forceClock bool) plan {
	r := rand.New(rand.NewPCG(seed, uint64(idx)*0x9E3779B97F4A7C15+1))
	p := plan{Index: idx, Lines: 4 + r.IntN(37), OutSize: 1 + r.IntN(16<<10), Run: time.Duration(r.IntN(5000)) * time.Microsecond}
	if !faults {
		return p
	}
	if r.IntN(100) < 10 {
		p.Cancel = true
		p.CancelCopies = 1
		if r.IntN(2) == 0 {
			p.CancelCopies = 2 + r.IntN(2)
		}
		p.CancelEarly = r.IntN(10) < 3
	}
	if r.IntN(100) < 12 {
		p.Cut, p.CutAfter = true, time.Duration(r.IntN(30000))*time.Microsecond
	}
	switch x := r.IntN(100); {
	case x < 10:
		p.AuthOp = authOp(1 + r.IntN(4))
		p.AuthFails = 1 + r.IntN(2)
		p.AuthAfter = p.AuthOp != opCreate && r.IntN(2) == 0
	case x < 20:
		p.AuthOp = authOp(1 + r.IntN(4))
		p.AuthDelay = time.Duration(1+r.IntN(40)) * time.Millisecond
	case x < 23:
		p.DupOffer = true
	}
	p.Crash = forceCrash || r.IntN(1000) < 3
	if forceClock || r.IntN(100) < 1 {
		s := time.Duration(1+r.IntN(10)) * time.Second
		if r.IntN(2) == 0 {
			s = -s
		}
		p.ClockStep = s
	}
	return p
}

func (p plan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d lines=%d out=%d run=%s", p.Index, p.Lines, p.OutSize, p.Run)
	if p.Cancel {
		fmt.Fprintf(&b, " cancel×%d early=%v", p.CancelCopies, p.CancelEarly)
	}
	if p.Cut {
		fmt.Fprintf(&b, " cut@%s", p.CutAfter)
	}
	if p.AuthOp != opNone {
		fmt.Fprintf(&b, " auth %s fails=%d after=%v delay=%s", p.AuthOp, p.AuthFails, p.AuthAfter, p.AuthDelay)
	}
	if p.DupOffer {
		b.WriteString(" dup-offer")
	}
	if p.Crash {
		b.WriteString(" crash")
	}
	if p.ClockStep != 0 {
		fmt.Fprintf(&b, " clock%+v", p.ClockStep)
	}
	return b.String()
}

// scheduleDigest is a digest of every plan: the same seed, n and backends
// print the same digest.
func scheduleDigest(plans []plan) string {
	h := sha256.New()
	for _, p := range plans {
		h.Write([]byte(p.String()))
		h.Write([]byte{'\n'})
	}
	return fmt.Sprintf("%x", h.Sum(nil)[:8])
}

// line is lifecycle idx's i-th stdout line.
func line(seed uint64, idx, i int) string {
	return fmt.Sprintf("soak seed=%d lifecycle=%d line=%03d %s\n", seed, idx, i, strings.Repeat("·", i%17))
}

// outputOf is lifecycle idx's output.
func outputOf(seed uint64, idx, size int) []byte {
	b := make([]byte, size)
	var k [16]byte
	binary.LittleEndian.PutUint64(k[:], seed)
	binary.LittleEndian.PutUint64(k[8:], uint64(idx))
	blk := sha256.Sum256(k[:])
	for i := range b {
		if i%32 == 0 && i > 0 {
			blk = sha256.Sum256(blk[:])
		}
		b[i] = blk[i%32]
	}
	return b
}

// counters counts faults by kind.
type counters struct{ m sync.Map }

func (c *counters) add(kind string, n int64) {
	v, _ := c.m.LoadOrStore(kind, new(atomic.Int64))
	v.(*atomic.Int64).Add(n)
}

func (c *counters) snapshot() map[string]int64 {
	out := map[string]int64{}
	c.m.Range(func(k, v any) bool { out[k.(string)] = v.(*atomic.Int64).Load(); return true })
	return out
}

func formatCounts(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%d", k, m[k])
	}
	return strings.TrimSpace(b.String())
}

// errInjected is the authority error the decorator injects: a storage
// hiccup the caller must retry.
var errInjected = errors.New("soak: injected authority failure")

// authFaults is the per-attempt fault state the decorators of every daemon
// incarnation of one cluster share.
type authFaults struct {
	m       sync.Map // wire.JobAttemptId → *attemptFault
	created sync.Map // wire.JobAttemptId → wire.LeaseId: CreateLease committed
	cnt     *counters
	// resend is the offer re-send period; a DupOffer AcceptLease is held
	// longer than it.
	resend time.Duration
}

type attemptFault struct {
	p    plan
	left atomic.Int64
	slow atomic.Bool // latency counted once
	dup  atomic.Bool
}

func (f *authFaults) arm(a wire.JobAttemptId, p plan) {
	af := &attemptFault{p: p}
	af.left.Store(int64(p.AuthFails))
	f.m.Store(a, af)
}

// before runs before op on attempt: latency, and whether to fail (before
// or after the inner call).
func (f *authFaults) before(ctx context.Context, op authOp, a wire.JobAttemptId) (failBefore, failAfter bool) {
	v, ok := f.m.Load(a)
	if !ok {
		return false, false
	}
	af := v.(*attemptFault)
	if op == opAccept && af.p.DupOffer && af.dup.CompareAndSwap(false, true) {
		f.cnt.add(fDupOffer, 1)
		sleepCtx(ctx, f.resend*3/2)
	}
	if af.p.AuthOp != op {
		return false, false
	}
	if af.p.AuthDelay > 0 {
		if af.slow.CompareAndSwap(false, true) {
			f.cnt.add(fAuthLatency, 1)
		}
		sleepCtx(ctx, af.p.AuthDelay)
	}
	if af.left.Load() > 0 && af.left.Add(-1) >= 0 {
		if af.p.AuthAfter {
			f.cnt.add(fAuthErrAfter, 1)
			return false, true
		}
		f.cnt.add(fAuthErrBefore, 1)
		return true, false
	}
	return false, false
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// faultAuth decorates one daemon incarnation's authority with the
// cluster's per-attempt faults.
type faultAuth struct {
	authority.Authority
	f *authFaults
}

func (a *faultAuth) Unwrap() authority.Authority { return a.Authority }

func (a *faultAuth) CreateLease(ctx context.Context, l authority.Lease) error {
	if fb, _ := a.f.before(ctx, opCreate, l.Attempt); fb {
		return errInjected
	}
	err := a.Authority.CreateLease(ctx, l)
	if err == nil {
		a.f.created.Store(l.Attempt, l.ID)
	}
	return err
}

func (a *faultAuth) AcceptLease(ctx context.Context, id wire.LeaseId, at wire.JobAttemptId, s authority.SessionRef, now time.Time) (authority.Lease, error) {
	fb, fa := a.f.before(ctx, opAccept, at)
	if fb {
		return authority.Lease{}, errInjected
	}
	l, err := a.Authority.AcceptLease(ctx, id, at, s, now)
	if err == nil && fa {
		return authority.Lease{}, errInjected
	}
	return l, err
}

func (a *faultAuth) RenewLease(ctx context.Context, msg wire.MessageId, id wire.LeaseId, at wire.JobAttemptId, s authority.SessionRef, now time.Time) (authority.RenewResult, error) {
	fb, fa := a.f.before(ctx, opRenew, at)
	if fb {
		return authority.RenewResult{}, errInjected
	}
	r, err := a.Authority.RenewLease(ctx, msg, id, at, s, now)
	if err == nil && fa {
		return authority.RenewResult{}, errInjected
	}
	return r, err
}

func (a *faultAuth) CompleteAttempt(ctx context.Context, c authority.Completion) (authority.AckKind, error) {
	fb, fa := a.f.before(ctx, opComplete, c.Attempt)
	if fb {
		return 0, errInjected
	}
	k, err := a.Authority.CompleteAttempt(ctx, c)
	if err == nil && fa {
		return 0, errInjected
	}
	return k, err
}

// ---- the durable log store ----

// errCrashed is what a crashed daemon incarnation's sink view answers.
var errCrashed = errors.New("soak: daemon crashed")

// durableLogs models a log store with explicit durability (a file per
// attempt and fsync): Sync makes what was appended durable; a crash drops
// what was appended but not synced and fences the crashed daemon's view,
// as a process crash would. Each daemon incarnation gets its own view.
type durableLogs struct {
	mu sync.Mutex
	m  map[wire.JobAttemptId]*logAttempt
}

type logAttempt struct {
	recs     []logs.Record
	appended uint64
	durable  uint64
}

type sinkView struct {
	s    *durableLogs
	dead bool // under s.mu
}

func newDurableLogs() *durableLogs { return &durableLogs{m: map[wire.JobAttemptId]*logAttempt{}} }

func (s *durableLogs) view() *sinkView { return &sinkView{s: s} }

func (s *durableLogs) get(a wire.JobAttemptId) *logAttempt {
	m := s.m[a]
	if m == nil {
		m = &logAttempt{}
		s.m[a] = m
	}
	return m
}

// crash fences v and drops every record appended but not synced.
func (s *durableLogs) crash(v *sinkView) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	v.dead = true
	lost := 0
	for _, m := range s.m {
		lost += int(m.appended - m.durable)
		m.recs = m.recs[:m.durable]
		m.appended = m.durable
	}
	return lost
}

// records returns the attempt's durable records.
func (s *durableLogs) records(a wire.JobAttemptId) []logs.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.m[a]
	if m == nil {
		return nil
	}
	return append([]logs.Record(nil), m.recs[:m.durable]...)
}

func (v *sinkView) Append(a wire.JobAttemptId, seq uint64, kind wlogs.LogStreamKind, ts uint64, data []byte) error {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	if v.dead {
		return errCrashed
	}
	m := v.s.get(a)
	if seq != m.appended+1 {
		return fmt.Errorf("soak sink: append seq %d after %d", seq, m.appended)
	}
	m.appended = seq
	m.recs = append(m.recs, logs.Record{Seq: seq, Kind: kind, TimestampMs: ts, Data: append([]byte(nil), data...)})
	return nil
}

func (v *sinkView) Durable(a wire.JobAttemptId) uint64 {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	if v.dead {
		return 0
	}
	return v.s.get(a).durable
}

func (v *sinkView) Sync(a wire.JobAttemptId) error {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	if v.dead {
		return errCrashed
	}
	m := v.s.get(a)
	m.durable = m.appended
	return nil
}

// ---- the daemon clock ----

// stepClock is the daemon's Now: real time plus an offset the schedule
// steps, kept within ±maxClockOffset.
type stepClock struct{ off atomic.Int64 }

const maxClockOffset = 10 * time.Second

func (c *stepClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// step moves the offset by d, reflected back into range; it returns the
// effective jump.
func (c *stepClock) step(d time.Duration) time.Duration {
	old := time.Duration(c.off.Load())
	n := old + d
	if n > maxClockOffset || n < -maxClockOffset {
		n = old - d
	}
	c.off.Store(int64(n))
	return n - old
}
