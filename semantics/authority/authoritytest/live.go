package authoritytest

import (
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/wire"
)

// testLiveLeases: LiveLeases lists the offered and accepted leases of
// every session, on every handle of a shared store (the HA retention live
// set, issue 15 item 5), and none that was rejected or revoked.
func testLiveLeases(t *testing.T, o Opener) {
	a := o.Open(t)
	ll := authority.LiveListerOf(a)
	if ll == nil {
		t.Skip("implementation lists no live leases")
	}
	f := newFixture(t, a)
	offered := f.lease(t, time.Minute)
	accepted := f.accepted(t, time.Minute)
	rejected := f.lease(t, time.Minute)
	if err := a.RejectLease(f.ctx, rejected.ID, rejected.Attempt, f.ref(), t0); err != nil {
		t.Fatal(err)
	}
	revoked := f.lease(t, time.Minute)
	if err := a.RevokeLease(f.ctx, revoked.ID, "test", t0); err != nil {
		t.Fatal(err)
	}
	// A session another daemon holds, on its own handle when the store
	// is shared.
	b := a
	if o.Shared != nil {
		b = o.Shared(t)
	}
	elsewhere := newFixture(t, b).lease(t, time.Minute)

	got, err := ll.LiveLeases(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[wire.LeaseId]authority.Lease{}
	for _, l := range got {
		byID[l.ID] = l
	}
	for _, want := range []authority.Lease{offered, accepted, elsewhere} {
		l, ok := byID[want.ID]
		if !ok {
			t.Fatalf("live lease %s not listed (%d listed)", want.ID, len(got))
		}
		if l.Attempt != want.Attempt || l.Payload != want.Payload || !l.State.Live() {
			t.Fatalf("listed %+v, want %+v", l, want)
		}
	}
	for _, gone := range []authority.Lease{rejected, revoked} {
		if _, ok := byID[gone.ID]; ok {
			t.Fatalf("lease %s listed after it lost its authority", gone.ID)
		}
	}
}
