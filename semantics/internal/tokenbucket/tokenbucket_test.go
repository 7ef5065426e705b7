package tokenbucket

import (
	"context"
	"testing"
	"time"
)

// TestTake: a full bucket gives its burst at once, then refuses with the
// wait until the next token, which accrues at the rate.
func TestTake(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := New(10, 3)
	for i := range 3 {
		if ok, _ := b.Take(t0); !ok {
			t.Fatalf("token %d of the burst refused", i)
		}
	}
	ok, wait := b.Take(t0)
	if ok || wait != 100*time.Millisecond {
		t.Fatalf("over the burst: ok=%v wait=%v, want a refusal and 100ms", ok, wait)
	}
	if ok, wait = b.Take(t0.Add(40 * time.Millisecond)); ok || wait != 60*time.Millisecond {
		t.Fatalf("40ms later: ok=%v wait=%v, want 60ms", ok, wait)
	}
	if ok, _ = b.Take(t0.Add(100 * time.Millisecond)); !ok {
		t.Fatal("a token accrued after 100ms was refused")
	}
	if ok, _ = b.Take(t0.Add(time.Hour)); !ok {
		t.Fatal("refill after an hour refused")
	}
	// The refill is capped at the burst.
	n := 0
	for {
		if ok, _ := b.Take(t0.Add(time.Hour)); !ok {
			break
		}
		n++
	}
	if n != 2 {
		t.Fatalf("after the refill %d more tokens, want 2 (burst 3, one taken)", n)
	}
}

// TestTakeNoRate: with no rate only the burst is given; the hint is 1s.
func TestTakeNoRate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := New(0, 1)
	if ok, _ := b.Take(t0); !ok {
		t.Fatal("the burst was refused")
	}
	if ok, wait := b.Take(t0.Add(time.Hour)); ok || wait != time.Second {
		t.Fatalf("ok=%v wait=%v, want a refusal with 1s", ok, wait)
	}
}

// TestReserve: reservations go into debt, beyond the burst too, and the
// delay is the time the debt takes to repay.
func TestReserve(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := New(1000, 100)
	if d := b.Reserve(t0, 100); d != 0 {
		t.Fatalf("the burst: delay %v, want 0", d)
	}
	if d := b.Reserve(t0, 50); d != 50*time.Millisecond {
		t.Fatalf("50 in debt: delay %v, want 50ms", d)
	}
	if d := b.Reserve(t0, 450); d != 500*time.Millisecond { // beyond the burst
		t.Fatalf("500 in debt: delay %v, want 500ms", d)
	}
	if d := b.Reserve(t0.Add(500*time.Millisecond), 0); d != 0 {
		t.Fatalf("nothing: delay %v", d)
	}
	if d := b.Reserve(t0.Add(600*time.Millisecond), 100); d != 0 {
		t.Fatalf("after the debt was repaid (100 tokens accrued): delay %v, want 0", d)
	}
}

// TestSleep: Sleep reports true when the wait passes and false at once
// when the context ends first.
func TestSleep(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep(1ms) = false under a live context")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep(1h) = true under an ended context")
	}
}
