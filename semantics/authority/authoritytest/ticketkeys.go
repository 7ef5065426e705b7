package authoritytest

import (
	"context"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/authority"
)

func ticketKeys(t *testing.T, a authority.Authority) authority.TicketKeyStore {
	t.Helper()
	return facet(t, a, authority.TicketKeysOf, "keeps no TLS session ticket keys")
}

// RunTicketKeys runs the TLS session ticket key tests (issue 25 item 4):
// creation, rotation order, deletion of old keys, and, with o.Shared, that
// a second instance over the same storage (another daemon of an HA set, or
// the same daemon after a restart) gets the same keys.
func RunTicketKeys(t *testing.T, o Opener) {
	t.Run("Rotation", func(t *testing.T) { testTicketRotation(t, o) })
	runShared(t, o, "Shared", testTicketShared)
}

func testTicketRotation(t *testing.T, o Opener) {
	ks := ticketKeys(t, o.Open(t))
	ctx := context.Background()
	const period = time.Hour
	if _, err := ks.TicketKeys(ctx, t0, 0); err == nil {
		t.Fatal("a zero rotation period was accepted")
	}
	p0, err := ks.TicketKeys(ctx, t0, period)
	if err != nil {
		t.Fatal(err)
	}
	if len(p0) != 2 {
		t.Fatalf("first call: %d keys, want 2 (current, next)", len(p0))
	}
	if p0[0] == p0[1] || p0[0] == ([32]byte{}) {
		t.Fatalf("current and next keys are equal or zero")
	}
	again, err := ks.TicketKeys(ctx, t0.Add(period/2), period)
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 2 || again[0] != p0[0] || again[1] != p0[1] {
		t.Fatal("the keys changed within one period")
	}
	// Next period: the former next key encrypts, the former current one
	// is kept for decryption after the new next one.
	p1, err := ks.TicketKeys(ctx, t0.Add(period), period)
	if err != nil {
		t.Fatal(err)
	}
	if len(p1) != 3 || p1[0] != p0[1] || p1[2] != p0[0] || p1[1] == p0[0] || p1[1] == p0[1] {
		t.Fatalf("after one rotation: got %d keys in the wrong order, want [old next, new, old current]", len(p1))
	}
	p2, err := ks.TicketKeys(ctx, t0.Add(2*period), period)
	if err != nil {
		t.Fatal(err)
	}
	if len(p2) != 4 || p2[0] != p1[1] || p2[2] != p0[1] || p2[3] != p0[0] {
		t.Fatalf("after two rotations: %d keys or wrong order, want [current, next, previous, the one before]", len(p2))
	}
	// A third rotation drops the key of period 0 (older than
	// TicketKeysKept periods).
	p3, err := ks.TicketKeys(ctx, t0.Add(3*period), period)
	if err != nil {
		t.Fatal(err)
	}
	if len(p3) != 2+authority.TicketKeysKept {
		t.Fatalf("after three rotations: %d keys, want %d", len(p3), 2+authority.TicketKeysKept)
	}
	for _, k := range p3 {
		if k == p0[0] {
			t.Fatal("the key of a period older than TicketKeysKept periods is still returned")
		}
	}
	// Deleted for good: asking again for period 0 creates a new key.
	back, err := ks.TicketKeys(ctx, t0, period)
	if err != nil {
		t.Fatal(err)
	}
	if back[0] == p0[0] {
		t.Fatal("the deleted key of period 0 came back")
	}
}

func testTicketShared(t *testing.T, o Opener) {
	a := o.Open(t)
	ctx := context.Background()
	const period = 24 * time.Hour
	first, err := ticketKeys(t, a).TicketKeys(ctx, t0, period)
	if err != nil {
		t.Fatal(err)
	}
	b := o.Shared(t)
	if err := a.Close(); err != nil { // the first daemon stops (or restarts)
		t.Fatal(err)
	}
	second, err := ticketKeys(t, b).TicketKeys(ctx, t0.Add(time.Minute), period)
	if err != nil {
		t.Fatal(err)
	}
	if len(second) != len(first) {
		t.Fatalf("second instance: %d keys, want %d", len(second), len(first))
	}
	for i := range first {
		if first[i] != second[i] {
			t.Fatalf("key %d differs between two instances over one database", i)
		}
	}
	// Two instances racing on a fresh period converge.
	c := o.Shared(t)
	type res struct {
		k   [][32]byte
		err error
	}
	out := make(chan res, 2)
	for _, ks := range []authority.TicketKeyStore{ticketKeys(t, b), ticketKeys(t, c)} {
		go func() {
			k, err := ks.TicketKeys(ctx, t0.Add(5*period), period)
			out <- res{k, err}
		}()
	}
	r1, r2 := <-out, <-out
	if r1.err != nil || r2.err != nil {
		t.Fatal(r1.err, r2.err)
	}
	if r1.k[0] != r2.k[0] || r1.k[1] != r2.k[1] {
		t.Fatal("two instances creating the same period's keys concurrently disagree")
	}
}
