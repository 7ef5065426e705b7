// Package authoritytest is the one conformance suite every Authority
// implementation passes (SQLite and PostgreSQL alike).
package authoritytest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/wire"
)

// Opener returns a fresh, empty Authority for one test. Shared, when not nil,
// returns a second Authority over the SAME storage as the first one opened
// in this test (another daemon of an HA pair); implementations that cannot
// share storage leave it nil.
type Opener struct {
	Open   func(t *testing.T) authority.Authority
	Shared func(t *testing.T) authority.Authority
}

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

type fixture struct {
	a       authority.Authority
	ctx     context.Context
	runner  wire.RunnerId
	session wire.AgentSessionId
	epoch   uint64
}

func newFixture(t *testing.T, a authority.Authority) *fixture {
	t.Helper()
	f := &fixture{a: a, ctx: context.Background(), runner: wire.NewRunnerId(), session: wire.NewAgentSessionId()}
	g, err := a.RegisterSession(f.ctx, authority.Registration{Runner: f.runner, Session: f.session,
		Transport: wire.NewTransportSessionId(), Daemon: "d1", Remote: "127.0.0.1:1", Now: t0})
	if err != nil {
		t.Fatalf("RegisterSession: %v", err)
	}
	f.epoch = g.Epoch
	return f
}

func (f *fixture) ref() authority.SessionRef {
	return authority.SessionRef{Session: f.session, Epoch: f.epoch}
}

func (f *fixture) lease(t *testing.T, ttl time.Duration) authority.Lease {
	t.Helper()
	l := authority.Lease{ID: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId(), Job: wire.NewJobId(),
		Runner: f.runner, Session: f.session, TTL: ttl, ExpiresAt: t0.Add(ttl), CreatedAt: t0,
		Payload: wire.CasObjectRef{Algorithm: wire.DigestBLAKE3, Size: 42}}
	l.Spec.Digest[0] = 7
	l.Payload.Digest[1] = 9
	if err := f.a.CreateLease(f.ctx, l); err != nil {
		t.Fatalf("CreateLease: %v", err)
	}
	return l
}

// accepted is lease, then accepted by f's session at t0.
func (f *fixture) accepted(t *testing.T, ttl time.Duration) authority.Lease {
	t.Helper()
	l := f.lease(t, ttl)
	if _, err := f.a.AcceptLease(f.ctx, l.ID, l.Attempt, f.ref(), t0); err != nil {
		t.Fatal(err)
	}
	return l
}

// Run runs the suite.
func Run(t *testing.T, o Opener) {
	tests := []struct {
		name string
		fn   func(t *testing.T, o Opener)
	}{
		{"EpochsAndFencing", testEpochs},
		{"NewSessionDoesNotInherit", testNewSession},
		{"SessionOwnership", testOwnership},
		{"RunnerDisabled", testDisabled},
		{"DuplicateOfferSafe", testDuplicateOffer},
		{"AcceptLease", testAccept},
		{"RenewIdempotent", testRenew},
		{"CancelIdempotent", testCancel},
		{"CompletionExactlyOnce", testCompletion},
		{"CompletionConcurrentRetries", testCompletionConcurrent},
		{"Resync", testResync},
		{"ExpiryAndRevocation", testExpiry},
		{"ExpireLeaseRechecksUnderLock", testExpireRecheck},
		{"ExpireLeaseRacesRenewals", testExpireRace},
		{"DedupRetention", testDedup},
		{"LeaseRoundTrip", testLeaseRoundTrip},
		{"SessionLeases", testSessionLeases},
		{"SessionLeasesBounded", testSessionLeasesBounded},
		{"LiveLeases", testLiveLeases},
		{"EnrollmentTokens", testTokens},
		{"EnrollmentTokenRace", testTokenRace},
		{"Certificates", testCertificates},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, o) })
	}
	runShared(t, o, "SharedStorage", testShared)
	runShared(t, o, "SharedExpireRacesRenewals", func(t *testing.T, o Opener) {
		// The sweep on one daemon, the renewals on another (HA, §227–230).
		a := o.Open(t)
		expireRace(t, a, o.Shared(t))
	})
	runShared(t, o, "SharedIdentities", testIdentityShared)
}

// runShared runs fn as the subtest name, skipped when the implementation
// cannot share storage between instances (o.Shared nil).
func runShared(t *testing.T, o Opener, name string, fn func(t *testing.T, o Opener)) {
	t.Run(name, func(t *testing.T) {
		if o.Shared == nil {
			t.Skip("implementation does not share storage between instances")
		}
		fn(t, o)
	})
}

// facet returns the optional interface of(a) (authority.InventoryOf, say)
// and fails the test, saying a's type "missing", when a lacks it.
// together runs work(0) … work(n-1) in n goroutines released at once (so
// that they race) and returns when all of them have.
func together(n int, work func(i int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			work(i)
		}()
	}
	close(start)
	wg.Wait()
}

func facet[T any](t *testing.T, a authority.Authority, of func(authority.Authority) T, missing string) T {
	t.Helper()
	v := of(a)
	if any(v) == nil {
		t.Fatalf("%T %s", a, missing)
	}
	return v
}

func testEpochs(t *testing.T, o Opener) {
	f := newFixture(t, o.Open(t))
	if f.epoch != 1 {
		t.Fatalf("first epoch = %d, want 1", f.epoch)
	}
	t2 := wire.NewTransportSessionId()
	g, err := f.a.RegisterSession(f.ctx, authority.Registration{Runner: f.runner, Session: f.session, Transport: t2, Daemon: "d2", Now: t0.Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if g.Epoch != 2 || g.Previous == nil || g.Previous.Epoch != 1 || g.Previous.Daemon != "d1" {
		t.Fatalf("re-registration grant = %+v (previous %+v), want epoch 2 fencing epoch 1 on d1", g, g.Previous)
	}
	h, err := f.a.CheckEpoch(f.ctx, f.session, 1)
	if !errors.Is(err, authority.ErrFenced) {
		t.Fatalf("CheckEpoch(old) = %v, want ErrFenced", err)
	}
	if h.Epoch != 2 || h.Transport != t2 || h.Daemon != "d2" {
		t.Fatalf("fenced side learns holder %+v, want epoch 2 transport %s on d2", h, t2)
	}
	if _, err := f.a.CheckEpoch(f.ctx, f.session, 2); err != nil {
		t.Fatalf("CheckEpoch(current) = %v", err)
	}
	// A message of the fenced transport is rejected.
	l := f.lease(t, time.Minute)
	if _, err := f.a.AcceptLease(f.ctx, l.ID, l.Attempt, authority.SessionRef{Session: f.session, Epoch: 1}, t0); !errors.Is(err, authority.ErrFenced) {
		t.Fatalf("AcceptLease on fenced epoch = %v, want ErrFenced", err)
	}
	// The same session keeps its authority on the new transport (§14).
	if _, err := f.a.AcceptLease(f.ctx, l.ID, l.Attempt, authority.SessionRef{Session: f.session, Epoch: 2}, t0); err != nil {
		t.Fatalf("AcceptLease on current epoch = %v", err)
	}
}

func testNewSession(t *testing.T, o Opener) {
	f := newFixture(t, o.Open(t))
	l := f.accepted(t, time.Minute)
	// The agent restarts: new AgentSessionId (§15).
	a2 := wire.NewAgentSessionId()
	g, err := f.a.RegisterSession(f.ctx, authority.Registration{Runner: f.runner, Session: a2, Transport: wire.NewTransportSessionId(), Now: t0.Add(time.Second)})
	if err != nil || g.Epoch != 1 {
		t.Fatalf("new session grant %+v, %v", g, err)
	}
	got, err := f.a.Lease(f.ctx, l.ID)
	if err != nil || got.State != authority.LeaseRevoked {
		t.Fatalf("old session's lease state = %q (%v), want revoked", got.State, err)
	}
	// The new session cannot use the old lease…
	if _, err := f.a.AcceptLease(f.ctx, l.ID, l.Attempt, authority.SessionRef{Session: a2, Epoch: 1}, t0); !errors.Is(err, authority.ErrStaleLease) {
		t.Fatalf("new session accepting old lease = %v, want ErrStaleLease", err)
	}
	ack, err := f.a.CompleteAttempt(f.ctx, authority.Completion{MessageID: wire.NewMessageId(), Attempt: l.Attempt, Lease: l.ID,
		Session: authority.SessionRef{Session: a2, Epoch: 1}, Now: t0})
	if err != nil || ack != authority.AckStaleRejected {
		t.Fatalf("new session completing old lease = %v, %v; want StaleRejected", ack, err)
	}
	// …and a replay from the old session is rejected too (§179).
	ack, err = f.a.CompleteAttempt(f.ctx, authority.Completion{MessageID: wire.NewMessageId(), Attempt: l.Attempt, Lease: l.ID, Session: f.ref(), Now: t0})
	if err != nil || ack != authority.AckStaleRejected {
		t.Fatalf("old session completion replay = %v, %v; want StaleRejected", ack, err)
	}
	if _, err := f.a.RegisterSession(f.ctx, authority.Registration{Runner: f.runner, Session: f.session, Transport: wire.NewTransportSessionId(), Now: t0}); !errors.Is(err, authority.ErrStaleSession) {
		t.Fatalf("re-registering the ended session = %v, want ErrStaleSession", err)
	}
	if n, _ := f.a.Completions(f.ctx, l.Attempt); n != 0 {
		t.Fatalf("completions = %d, want 0", n)
	}
}

func testOwnership(t *testing.T, o Opener) {
	f := newFixture(t, o.Open(t))
	_, err := f.a.RegisterSession(f.ctx, authority.Registration{Runner: wire.NewRunnerId(), Session: f.session, Transport: wire.NewTransportSessionId(), Now: t0})
	if !errors.Is(err, authority.ErrSessionOwnership) {
		t.Fatalf("another runner claiming the session = %v, want ErrSessionOwnership", err)
	}
}

func testDisabled(t *testing.T, o Opener) {
	f := newFixture(t, o.Open(t))
	l := f.lease(t, time.Minute)
	if err := f.a.SetRunnerEnabled(f.ctx, f.runner, false, "compromised", t0); err != nil {
		t.Fatal(err)
	}
	st, err := f.a.RunnerStatus(f.ctx, f.runner)
	if err != nil || st.Enabled || st.Reason != "compromised" || st.Sessions != 0 {
		t.Fatalf("status after disable = %+v, %v", st, err)
	}
	if got, _ := f.a.Lease(f.ctx, l.ID); got.State != authority.LeaseRevoked {
		t.Fatalf("lease of disabled runner = %q, want revoked", got.State)
	}
	if _, err := f.a.RegisterSession(f.ctx, authority.Registration{Runner: f.runner, Session: wire.NewAgentSessionId(), Transport: wire.NewTransportSessionId(), Now: t0}); !errors.Is(err, authority.ErrRunnerDisabled) {
		t.Fatalf("register while disabled = %v, want ErrRunnerDisabled", err)
	}
	if err := f.a.SetRunnerEnabled(f.ctx, f.runner, true, "", t0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.a.RegisterSession(f.ctx, authority.Registration{Runner: f.runner, Session: wire.NewAgentSessionId(), Transport: wire.NewTransportSessionId(), Now: t0}); err != nil {
		t.Fatalf("register after re-enable = %v", err)
	}
}

func testDuplicateOffer(t *testing.T, o Opener) {
	f := newFixture(t, o.Open(t))
	l := f.lease(t, time.Minute)
	if err := f.a.CreateLease(f.ctx, l); err != nil {
		t.Fatalf("duplicate identical offer = %v, want nil", err)
	}
	l2 := l
	l2.Attempt = wire.NewJobAttemptId()
	if err := f.a.CreateLease(f.ctx, l2); !errors.Is(err, authority.ErrConflict) {
		t.Fatalf("conflicting offer = %v, want ErrConflict", err)
	}
}

func testAccept(t *testing.T, o Opener) {
	f := newFixture(t, o.Open(t))
	l := f.lease(t, time.Minute)
	for i := 0; i < 2; i++ {
		got, err := f.a.AcceptLease(f.ctx, l.ID, l.Attempt, f.ref(), t0)
		if err != nil || got.State != authority.LeaseAccepted {
			t.Fatalf("accept #%d = %q, %v", i, got.State, err)
		}
	}
	if _, err := f.a.AcceptLease(f.ctx, l.ID, wire.NewJobAttemptId(), f.ref(), t0); !errors.Is(err, authority.ErrStaleLease) {
		t.Fatalf("accept with wrong attempt = %v, want ErrStaleLease", err)
	}
	if _, err := f.a.AcceptLease(f.ctx, wire.NewLeaseId(), l.Attempt, f.ref(), t0); !errors.Is(err, authority.ErrStaleLease) {
		t.Fatalf("accept unknown lease = %v, want ErrStaleLease", err)
	}
	r := f.lease(t, time.Minute)
	if err := f.a.RejectLease(f.ctx, r.ID, r.Attempt, f.ref(), t0); err != nil {
		t.Fatal(err)
	}
	if err := f.a.RejectLease(f.ctx, r.ID, r.Attempt, f.ref(), t0); err != nil {
		t.Fatalf("repeated reject = %v", err)
	}
	if _, err := f.a.AcceptLease(f.ctx, r.ID, r.Attempt, f.ref(), t0); !errors.Is(err, authority.ErrStaleLease) {
		t.Fatalf("accept after reject = %v, want ErrStaleLease", err)
	}
}

func testRenew(t *testing.T, o Opener) {
	f := newFixture(t, o.Open(t))
	l := f.lease(t, 30*time.Second)
	msg := wire.NewMessageId()
	now := t0.Add(20 * time.Second)
	r1, err := f.a.RenewLease(f.ctx, msg, l.ID, l.Attempt, f.ref(), now)
	if err != nil || !r1.Extended || !r1.ExpiresAt.Equal(now.Add(30*time.Second)) {
		t.Fatalf("renew = %+v, %v; want extended to %v", r1, err, now.Add(30*time.Second))
	}
	// The same MessageId later gets the identical answer (§ renewals idempotent).
	r2, err := f.a.RenewLease(f.ctx, msg, l.ID, l.Attempt, f.ref(), now.Add(10*time.Second))
	if err != nil || r2 != r1 {
		t.Fatalf("duplicate renew = %+v, %v; want identical %+v", r2, err, r1)
	}
	// A renewal never shortens the lease.
	r3, err := f.a.RenewLease(f.ctx, wire.NewMessageId(), l.ID, l.Attempt, f.ref(), t0)
	if err != nil || !r3.ExpiresAt.Equal(r1.ExpiresAt) {
		t.Fatalf("earlier renew = %+v, %v; want expiry kept at %v", r3, err, r1.ExpiresAt)
	}
	if _, err := f.a.CancelAttempt(f.ctx, l.Attempt, 3, now); err != nil {
		t.Fatal(err)
	}
	r4, err := f.a.RenewLease(f.ctx, wire.NewMessageId(), l.ID, l.Attempt, f.ref(), now)
	if err != nil || !r4.Revoked || r4.CancelReason != 3 {
		t.Fatalf("renew after cancel = %+v, %v; want revoked with reason 3", r4, err)
	}
	r5, err := f.a.RenewLease(f.ctx, wire.NewMessageId(), wire.NewLeaseId(), l.Attempt, f.ref(), now)
	if err != nil || !r5.Unknown {
		t.Fatalf("renew unknown lease = %+v, %v; want Unknown", r5, err)
	}
}

func testCancel(t *testing.T, o Opener) {
	f := newFixture(t, o.Open(t))
	l := f.lease(t, time.Minute)
	for i := 0; i < 3; i++ {
		got, err := f.a.CancelAttempt(f.ctx, l.Attempt, 1, t0)
		if err != nil || !got.Cancelled || got.CancelReason != 1 || got.ID != l.ID {
			t.Fatalf("cancel #%d = %+v, %v", i, got, err)
		}
	}
	if _, err := f.a.CancelAttempt(f.ctx, wire.NewJobAttemptId(), 1, t0); !errors.Is(err, authority.ErrNotFound) {
		t.Fatalf("cancel unknown attempt = %v, want ErrNotFound", err)
	}
}

func testCompletion(t *testing.T, o Opener) {
	f := newFixture(t, o.Open(t))
	l := f.accepted(t, time.Minute)
	c := authority.Completion{MessageID: wire.NewMessageId(), Attempt: l.Attempt, Lease: l.ID, Session: f.ref(),
		Result: []byte{0, 0}, Outputs: []wire.CasObjectRef{{Size: 5}}, Now: t0}
	if ack, err := f.a.CompleteAttempt(f.ctx, c); err != nil || ack != authority.AckAccepted {
		t.Fatalf("completion = %v, %v; want Accepted", ack, err)
	}
	// The ack was lost; the agent reconnects (new epoch) and retries with the
	// same MessageId (§177).
	g, err := f.a.RegisterSession(f.ctx, authority.Registration{Runner: f.runner, Session: f.session, Transport: wire.NewTransportSessionId(), Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	c.Session.Epoch = g.Epoch
	if ack, err := f.a.CompleteAttempt(f.ctx, c); err != nil || ack != authority.AckDuplicateAccepted {
		t.Fatalf("retried completion = %v, %v; want DuplicateAccepted", ack, err)
	}
	// A different message for a completed attempt is stale.
	c2 := c
	c2.MessageID = wire.NewMessageId()
	if ack, err := f.a.CompleteAttempt(f.ctx, c2); err != nil || ack != authority.AckStaleRejected {
		t.Fatalf("second completion = %v, %v; want StaleRejected", ack, err)
	}
	// The fenced transport cannot complete anything.
	l2 := f.lease(t, time.Minute)
	fenced := authority.SessionRef{Session: f.session, Epoch: g.Epoch - 1}
	if _, err := f.a.CompleteAttempt(f.ctx, authority.Completion{MessageID: wire.NewMessageId(), Attempt: l2.Attempt, Lease: l2.ID, Session: fenced, Now: t0}); !errors.Is(err, authority.ErrFenced) {
		t.Fatalf("completion from fenced transport = %v, want ErrFenced", err)
	}
	if n, err := f.a.Completions(f.ctx, l.Attempt); err != nil || n != 1 {
		t.Fatalf("completions = %d, %v; want exactly 1", n, err)
	}
	got, _ := f.a.Lease(f.ctx, l.ID)
	if got.State != authority.LeaseCompleted {
		t.Fatalf("lease state = %q, want completed", got.State)
	}
	// Old lease replay after completion: stale (§144).
	if _, err := f.a.AcceptLease(f.ctx, l.ID, l.Attempt, c.Session, t0); !errors.Is(err, authority.ErrStaleLease) {
		t.Fatalf("accept of completed lease = %v, want ErrStaleLease", err)
	}
}

func testCompletionConcurrent(t *testing.T, o Opener) {
	f := newFixture(t, o.Open(t))
	const attempts, retries = 8, 4
	type job struct {
		l   authority.Lease
		msg wire.MessageId
	}
	jobs := make([]job, attempts)
	for i := range jobs {
		jobs[i] = job{l: f.lease(t, time.Minute), msg: wire.NewMessageId()}
	}
	var mu sync.Mutex
	counts := map[authority.AckKind]int{}
	var wg sync.WaitGroup
	for _, j := range jobs {
		for r := 0; r < retries; r++ {
			wg.Add(1)
			go func(j job) {
				defer wg.Done()
				ack, err := f.a.CompleteAttempt(f.ctx, authority.Completion{MessageID: j.msg, Attempt: j.l.Attempt, Lease: j.l.ID, Session: f.ref(), Now: t0})
				if err != nil {
					t.Errorf("concurrent completion: %v", err)
					return
				}
				mu.Lock()
				counts[ack]++
				mu.Unlock()
			}(j)
		}
	}
	wg.Wait()
	if counts[authority.AckAccepted] != attempts || counts[authority.AckDuplicateAccepted] != attempts*(retries-1) {
		t.Fatalf("acks = %v; want %d Accepted and %d DuplicateAccepted", counts, attempts, attempts*(retries-1))
	}
	for _, j := range jobs {
		if n, _ := f.a.Completions(f.ctx, j.l.Attempt); n != 1 {
			t.Fatalf("attempt %s has %d completions, want 1", j.l.Attempt, n)
		}
	}
}

func testResync(t *testing.T, o Opener) {
	f := newFixture(t, o.Open(t))
	cont := f.lease(t, 30*time.Second)
	canc := f.lease(t, 30*time.Second)
	done := f.lease(t, 30*time.Second)
	if _, err := f.a.CancelAttempt(f.ctx, canc.Attempt, 4, t0); err != nil {
		t.Fatal(err)
	}
	if ack, _ := f.a.CompleteAttempt(f.ctx, authority.Completion{MessageID: wire.NewMessageId(), Attempt: done.Attempt, Lease: done.ID, Session: f.ref(), Now: t0}); ack != authority.AckAccepted {
		t.Fatalf("complete = %v", ack)
	}
	unknown := authority.AttemptClaim{Attempt: wire.NewJobAttemptId(), Lease: wire.NewLeaseId()}
	claims := []authority.AttemptClaim{{Attempt: cont.Attempt, Lease: cont.ID}, {Attempt: canc.Attempt, Lease: canc.ID}, {Attempt: done.Attempt, Lease: done.ID}, unknown}
	now := t0.Add(10 * time.Second)
	for round := 0; round < 2; round++ { // repeated resync is safe (§121)
		ds, err := f.a.Resync(f.ctx, f.ref(), claims, now)
		if err != nil || len(ds) != 4 {
			t.Fatalf("resync = %v, %v", ds, err)
		}
		if ds[0].Kind != authority.DecisionContinue || !ds[0].ExpiresAt.Equal(now.Add(30*time.Second)) {
			t.Fatalf("continue decision = %+v, want Continue until %v", ds[0], now.Add(30*time.Second))
		}
		if ds[1].Kind != authority.DecisionCancel || ds[1].CancelReason != 4 {
			t.Fatalf("cancel decision = %+v", ds[1])
		}
		if ds[2].Kind != authority.DecisionStale || ds[3].Kind != authority.DecisionStale {
			t.Fatalf("stale decisions = %+v %+v", ds[2], ds[3])
		}
	}
	// Another session's resync cannot claim these leases.
	other := newFixture(t, f.a)
	ds, err := f.a.Resync(f.ctx, other.ref(), claims[:1], now)
	if err != nil || ds[0].Kind != authority.DecisionStale {
		t.Fatalf("foreign resync = %+v, %v; want Stale", ds, err)
	}
}

func testExpiry(t *testing.T, o Opener) {
	f := newFixture(t, o.Open(t))
	short := f.lease(t, 10*time.Second)
	long := f.lease(t, time.Hour)
	exp, err := f.a.ExpiredLeases(f.ctx, t0.Add(time.Minute), 100)
	if err != nil || len(exp) != 1 || exp[0].ID != short.ID {
		t.Fatalf("expired = %+v, %v; want only %s", exp, err, short.ID)
	}
	if err := f.a.RevokeLease(f.ctx, short.ID, "renewals stopped", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := f.a.RevokeLease(f.ctx, short.ID, "again", t0.Add(time.Minute)); err != nil {
		t.Fatalf("second revoke = %v", err)
	}
	got, _ := f.a.Lease(f.ctx, short.ID)
	if got.State != authority.LeaseRevoked || got.RevokeReason != "renewals stopped" {
		t.Fatalf("revoked lease = %+v", got)
	}
	if exp, _ := f.a.ExpiredLeases(f.ctx, t0.Add(time.Minute), 100); len(exp) != 0 {
		t.Fatalf("expired after revoke = %+v, want none", exp)
	}
	if ack, _ := f.a.CompleteAttempt(f.ctx, authority.Completion{MessageID: wire.NewMessageId(), Attempt: short.Attempt, Lease: short.ID, Session: f.ref(), Now: t0}); ack != authority.AckStaleRejected {
		t.Fatalf("completion of revoked lease = %v, want StaleRejected", ack)
	}
	_ = long
}

func testDedup(t *testing.T, o Opener) {
	f := newFixture(t, o.Open(t))
	l := f.lease(t, time.Minute)
	msg := wire.NewMessageId()
	c := authority.Completion{MessageID: msg, Attempt: l.Attempt, Lease: l.ID, Session: f.ref(), Now: t0}
	if ack, _ := f.a.CompleteAttempt(f.ctx, c); ack != authority.AckAccepted {
		t.Fatal("not accepted")
	}
	if _, err := f.a.RenewLease(f.ctx, wire.NewMessageId(), l.ID, l.Attempt, f.ref(), t0); err != nil {
		t.Fatal(err)
	}
	n, err := f.a.PruneDedup(f.ctx, t0.Add(time.Hour))
	if err != nil || n != 2 {
		t.Fatalf("pruned %d, %v; want 2", n, err)
	}
	// Retention is bounded, yet the completion stays exactly-once: the
	// completion record itself answers the retry.
	if ack, _ := f.a.CompleteAttempt(f.ctx, c); ack != authority.AckDuplicateAccepted {
		t.Fatalf("retry after prune = %v, want DuplicateAccepted", ack)
	}
}

func testLeaseRoundTrip(t *testing.T, o Opener) {
	f := newFixture(t, o.Open(t))
	l := f.lease(t, 90*time.Second)
	got, err := f.a.Lease(f.ctx, l.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != l.ID || got.Attempt != l.Attempt || got.Job != l.Job || got.Runner != l.Runner || got.Session != l.Session ||
		got.Spec != l.Spec || got.Payload != l.Payload || got.TTL != l.TTL || !got.ExpiresAt.Equal(l.ExpiresAt) || got.State != authority.LeaseOffered {
		t.Fatalf("lease round trip:\n got %+v\nwant %+v", got, l)
	}
	if _, err := f.a.Lease(f.ctx, wire.NewLeaseId()); !errors.Is(err, authority.ErrNotFound) {
		t.Fatalf("unknown lease = %v, want ErrNotFound", err)
	}
}

// leaseAt creates an offered lease of f's session created at `created`.
func (f *fixture) leaseAt(t *testing.T, created time.Time) authority.Lease {
	t.Helper()
	l := authority.Lease{ID: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId(), Job: wire.NewJobId(),
		Runner: f.runner, Session: f.session, TTL: time.Minute, ExpiresAt: created.Add(time.Minute), CreatedAt: created}
	if err := f.a.CreateLease(f.ctx, l); err != nil {
		t.Fatalf("CreateLease: %v", err)
	}
	return l
}

func leaseIDs(ls []authority.Lease) []wire.LeaseId {
	out := make([]wire.LeaseId, len(ls))
	for i, l := range ls {
		out[i] = l.ID
	}
	return out
}

func sameIDs(got []authority.Lease, want ...authority.Lease) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range want {
		if got[i].ID != want[i].ID {
			return false
		}
	}
	return true
}

// testSessionLeases: a session's leases by state, oldest first; other
// sessions' leases never show up (the HA offer re-send, §67, §229).
func testSessionLeases(t *testing.T, o Opener) {
	f := newFixture(t, o.Open(t))
	// Created out of order: the answer is ordered by creation time.
	l3 := f.leaseAt(t, t0.Add(3*time.Second))
	l1 := f.leaseAt(t, t0.Add(1*time.Second))
	l2 := f.leaseAt(t, t0.Add(2*time.Second))
	l4 := f.leaseAt(t, t0.Add(4*time.Second))
	if _, err := f.a.AcceptLease(f.ctx, l2.ID, l2.Attempt, f.ref(), t0); err != nil {
		t.Fatal(err)
	}
	if err := f.a.RejectLease(f.ctx, l4.ID, l4.Attempt, f.ref(), t0); err != nil {
		t.Fatal(err)
	}
	other := newFixture(t, f.a)
	foreign := other.leaseAt(t, t0)

	got, err := f.a.SessionLeases(f.ctx, f.session, authority.LeaseOffered)
	if err != nil || !sameIDs(got, l1, l3) {
		t.Fatalf("offered leases = %v, %v; want [%s %s]", leaseIDs(got), err, l1.ID, l3.ID)
	}
	if got[0].State != authority.LeaseOffered || got[0].Session != f.session || got[0].Attempt != l1.Attempt || !got[0].ExpiresAt.Equal(l1.ExpiresAt) {
		t.Fatalf("listed lease = %+v, want %+v", got[0], l1)
	}
	got, err = f.a.SessionLeases(f.ctx, f.session)
	if err != nil || !sameIDs(got, l1, l2, l3, l4) {
		t.Fatalf("all leases = %v, %v; want [%s %s %s %s]", leaseIDs(got), err, l1.ID, l2.ID, l3.ID, l4.ID)
	}
	got, err = f.a.SessionLeases(f.ctx, f.session, authority.LeaseAccepted, authority.LeaseRejected, authority.LeaseAccepted)
	if err != nil || !sameIDs(got, l2, l4) {
		t.Fatalf("accepted+rejected leases = %v, %v; want [%s %s]", leaseIDs(got), err, l2.ID, l4.ID)
	}
	if got[0].State != authority.LeaseAccepted || got[1].State != authority.LeaseRejected {
		t.Fatalf("states %q %q, want accepted rejected", got[0].State, got[1].State)
	}
	got, err = f.a.SessionLeases(f.ctx, other.session, authority.LeaseOffered)
	if err != nil || !sameIDs(got, foreign) {
		t.Fatalf("other session's leases = %v, %v; want [%s]", leaseIDs(got), err, foreign.ID)
	}
	if got, err := f.a.SessionLeases(f.ctx, wire.NewAgentSessionId()); err != nil || len(got) != 0 {
		t.Fatalf("unknown session's leases = %v, %v; want none", leaseIDs(got), err)
	}
	if _, err := f.a.SessionLeases(f.ctx, f.session, authority.LeaseState("lost")); err == nil {
		t.Fatal("unknown state accepted")
	}
	// Ending the session revokes its live leases: none is offered any more.
	if err := f.a.EndSession(f.ctx, f.session, t0); err != nil {
		t.Fatal(err)
	}
	if got, err := f.a.SessionLeases(f.ctx, f.session, authority.LeaseOffered); err != nil || len(got) != 0 {
		t.Fatalf("offered after EndSession = %v, %v; want none", leaseIDs(got), err)
	}
	if got, err := f.a.SessionLeases(f.ctx, f.session, authority.LeaseRevoked); err != nil || !sameIDs(got, l1, l2, l3) {
		t.Fatalf("revoked after EndSession = %v, %v; want [%s %s %s]", leaseIDs(got), err, l1.ID, l2.ID, l3.ID)
	}
}

// testSessionLeasesBounded: a session with more than MaxSessionLeases
// leases gets the oldest MaxSessionLeases.
func testSessionLeasesBounded(t *testing.T, o Opener) {
	f := newFixture(t, o.Open(t))
	n := authority.MaxSessionLeases + 3
	var newest authority.Lease
	for i := 0; i < n; i++ {
		newest = f.leaseAt(t, t0.Add(time.Duration(n-i)*time.Millisecond)) // newest first
	}
	got, err := f.a.SessionLeases(f.ctx, f.session, authority.LeaseOffered)
	if err != nil || len(got) != authority.MaxSessionLeases {
		t.Fatalf("listed %d leases, %v; want %d", len(got), err, authority.MaxSessionLeases)
	}
	if got[0].ID != newest.ID || !got[0].CreatedAt.Equal(t0.Add(time.Millisecond)) {
		t.Fatalf("first listed %s created %v; want the oldest %s", got[0].ID, got[0].CreatedAt, newest.ID)
	}
	for i := 1; i < len(got); i++ {
		if got[i].CreatedAt.Before(got[i-1].CreatedAt) {
			t.Fatalf("lease %d created %v before lease %d (%v)", i, got[i].CreatedAt, i-1, got[i-1].CreatedAt)
		}
	}
}

// testShared: two daemons over one store — an agent registered on the first
// reconnects to the second and resyncs its active attempt (§229).
func testShared(t *testing.T, o Opener) {
	a := o.Open(t)
	b := o.Shared(t)
	f := newFixture(t, a)
	l := f.accepted(t, time.Minute)
	g, err := b.RegisterSession(f.ctx, authority.Registration{Runner: f.runner, Session: f.session, Transport: wire.NewTransportSessionId(), Daemon: "d2", Now: t0})
	if err != nil || g.Epoch != 2 || g.Previous.Daemon != "d1" {
		t.Fatalf("register on second daemon = %+v, %v", g, err)
	}
	ds, err := b.Resync(f.ctx, authority.SessionRef{Session: f.session, Epoch: g.Epoch}, []authority.AttemptClaim{{Attempt: l.Attempt, Lease: l.ID}}, t0.Add(time.Second))
	if err != nil || len(ds) != 1 || ds[0].Kind != authority.DecisionContinue {
		t.Fatalf("resync on second daemon = %+v, %v; want Continue", ds, err)
	}
	// The first daemon now sees the old transport fenced.
	if _, err := a.CheckEpoch(f.ctx, f.session, 1); !errors.Is(err, authority.ErrFenced) {
		t.Fatalf("first daemon's view = %v, want ErrFenced", err)
	}
}

// testExpireRecheck: the sweep lists a lease as expired, the agent's renewal
// commits, then the sweep expires it: ExpireLease re-judges the expiry under
// the row lock, reports not expired and leaves the renewed lease live.
func testExpireRecheck(t *testing.T, o Opener) {
	f := newFixture(t, o.Open(t))
	l := f.accepted(t, 10*time.Second)
	sweepNow := t0.Add(20 * time.Second)
	exp, err := f.a.ExpiredLeases(f.ctx, sweepNow, 100)
	if err != nil || len(exp) != 1 || exp[0].ID != l.ID {
		t.Fatalf("expired = %+v, %v; want %s", exp, err, l.ID)
	}
	// A late renewal (the lease still lives in the store) commits between
	// the sweep's read and its revoke.
	renewAt := t0.Add(19 * time.Second)
	res, err := f.a.RenewLease(f.ctx, wire.NewMessageId(), l.ID, l.Attempt, f.ref(), renewAt)
	if err != nil || !res.Extended || !res.ExpiresAt.Equal(renewAt.Add(l.TTL)) {
		t.Fatalf("renew = %+v, %v; want extended to %v", res, err, renewAt.Add(l.TTL))
	}
	expired, err := f.a.ExpireLease(f.ctx, l.ID, sweepNow)
	if err != nil || expired {
		t.Fatalf("ExpireLease after a renewal = %v, %v; want not expired", expired, err)
	}
	got, err := f.a.Lease(f.ctx, l.ID)
	if err != nil || got.State != authority.LeaseAccepted || !got.ExpiresAt.Equal(renewAt.Add(l.TTL)) {
		t.Fatalf("lease after the sweep = %+v, %v; want accepted until %v", got, err, renewAt.Add(l.TTL))
	}
	// Once really expired it is expired exactly once, with the expiry reason;
	// ExpireLease on a revoked lease reports false and keeps the first reason.
	later := renewAt.Add(l.TTL).Add(time.Millisecond)
	if expired, err := f.a.ExpireLease(f.ctx, l.ID, renewAt.Add(l.TTL)); err != nil || expired {
		t.Fatalf("ExpireLease at exactly the expiry = %v, %v; want not expired (expiry must be before)", expired, err)
	}
	if expired, err := f.a.ExpireLease(f.ctx, l.ID, later); err != nil || !expired {
		t.Fatalf("ExpireLease past the expiry = %v, %v; want expired", expired, err)
	}
	if expired, err := f.a.ExpireLease(f.ctx, l.ID, later); err != nil || expired {
		t.Fatalf("second ExpireLease = %v, %v; want false", expired, err)
	}
	got, _ = f.a.Lease(f.ctx, l.ID)
	if got.State != authority.LeaseRevoked || got.RevokeReason != authority.ReasonLeaseExpired {
		t.Fatalf("expired lease = %+v; want revoked with %q", got, authority.ReasonLeaseExpired)
	}
	if res, err := f.a.RenewLease(f.ctx, wire.NewMessageId(), l.ID, l.Attempt, f.ref(), later); err != nil || !res.Revoked {
		t.Fatalf("renew after expiry = %+v, %v; want Revoked", res, err)
	}
	// An operator revocation stays unconditional: a lease far from expiry is
	// revoked, and ExpireLease then leaves it alone.
	op := f.lease(t, time.Hour)
	if err := f.a.RevokeLease(f.ctx, op.ID, "operator", t0); err != nil {
		t.Fatal(err)
	}
	if expired, err := f.a.ExpireLease(f.ctx, op.ID, t0.Add(2*time.Hour)); err != nil || expired {
		t.Fatalf("ExpireLease of a revoked lease = %v, %v; want false", expired, err)
	}
	if got, _ := f.a.Lease(f.ctx, op.ID); got.State != authority.LeaseRevoked || got.RevokeReason != "operator" {
		t.Fatalf("operator-revoked lease = %+v", got)
	}
	if _, err := f.a.ExpireLease(f.ctx, wire.NewLeaseId(), later); !errors.Is(err, authority.ErrNotFound) {
		t.Fatalf("ExpireLease of an unknown lease = %v, want ErrNotFound", err)
	}
}

func testExpireRace(t *testing.T, o Opener) {
	a := o.Open(t)
	expireRace(t, a, a)
}

// expireRace races renewals (through ra) against expiry sweeps (through sa)
// of the same lease. Every round a fresh lease expires at e; renewers renew
// it at e-1ms (so a renewal commits an expiry beyond the sweep's cutoff);
// sweepers expire it with the cutoff e+1ms (the lease, as first listed, is
// expired). Whatever the interleaving: the lease is revoked only if no
// renewal committed before the revocation, i.e. no renewer was told
// Extended; and a sweep expires it at most once.
func expireRace(t *testing.T, ra, sa authority.Authority) {
	f := newFixture(t, ra)
	const rounds, renewers, sweepers = 200, 3, 2
	ttl := 10 * time.Second
	for round := 0; round < rounds; round++ {
		l := f.lease(t, ttl)
		cutoff := l.ExpiresAt.Add(time.Millisecond)
		renewAt := l.ExpiresAt.Add(-time.Millisecond)
		var (
			mu             sync.Mutex
			extended       int
			revokedRenew   int
			maxExpiry      time.Time
			expiredBySweep int
		)
		renew := func() {
			res, err := ra.RenewLease(f.ctx, wire.NewMessageId(), l.ID, l.Attempt, f.ref(), renewAt)
			if err != nil {
				t.Errorf("round %d: renew: %v", round, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case res.Extended:
				extended++
				if res.ExpiresAt.After(maxExpiry) {
					maxExpiry = res.ExpiresAt
				}
			case res.Revoked:
				revokedRenew++
			default:
				t.Errorf("round %d: renew = %+v, want Extended or Revoked", round, res)
			}
		}
		sweep := func() {
			expired, err := sa.ExpireLease(f.ctx, l.ID, cutoff)
			if err != nil {
				t.Errorf("round %d: expire: %v", round, err)
				return
			}
			if expired {
				mu.Lock()
				expiredBySweep++
				mu.Unlock()
			}
		}
		// Goroutines 0..renewers-1 renew, the others sweep.
		together(renewers+sweepers, func(i int) {
			if i < renewers {
				renew()
			} else {
				sweep()
			}
		})
		if t.Failed() {
			return
		}
		got, err := sa.Lease(f.ctx, l.ID)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case expiredBySweep > 1:
			t.Fatalf("round %d: lease expired %d times, want at most once", round, expiredBySweep)
		case expiredBySweep == 1:
			// Revoked: then no renewal may have committed before it (a
			// committed renewal's expiry, renewAt+ttl, is beyond the cutoff).
			if extended != 0 {
				t.Fatalf("round %d: lease expired although %d renewals committed an expiry of %v (sweep cutoff %v)", round, extended, maxExpiry, cutoff)
			}
			if got.State != authority.LeaseRevoked || got.RevokeReason != authority.ReasonLeaseExpired {
				t.Fatalf("round %d: expired lease = %+v", round, got)
			}
		default:
			// Kept: a renewal committed first and every renewal extended it.
			if extended != renewers || revokedRenew != 0 {
				t.Fatalf("round %d: not expired, but %d of %d renewals extended (%d revoked)", round, extended, renewers, revokedRenew)
			}
			if got.State != authority.LeaseOffered || !got.ExpiresAt.Equal(maxExpiry) {
				t.Fatalf("round %d: kept lease = %+v; want live until %v", round, got, maxExpiry)
			}
			// Once past the renewed expiry, concurrent sweeps expire it
			// exactly once.
			var n atomic.Int32
			together(sweepers, func(int) {
				expired, err := sa.ExpireLease(f.ctx, l.ID, maxExpiry.Add(time.Millisecond))
				if err != nil {
					t.Errorf("round %d: expire: %v", round, err)
				} else if expired {
					n.Add(1)
				}
			})
			if n.Load() != 1 {
				t.Fatalf("round %d: %d concurrent sweeps expired the lease, want exactly 1", round, n.Load())
			}
		}
	}
}
