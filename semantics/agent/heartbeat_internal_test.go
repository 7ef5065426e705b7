package agent

import (
	"testing"
	"time"
)

// TestLivenessDeadline: the link is dead misses × interval after the last
// ack of any heartbeat, or after the link's start when none was acked; a
// late ack (of an older heartbeat) moves the deadline forward, an ack
// older than the last one never moves it back. Offsets are a fake clock.
func TestLivenessDeadline(t *testing.T) {
	const every = 100 * time.Millisecond
	v := newLiveness(3, every)
	if v.window != 300*time.Millisecond {
		t.Fatalf("window %v, want 300ms", v.window)
	}
	// No ack yet: counted from the link's start.
	if r := v.remaining(0); r != 300*time.Millisecond {
		t.Fatalf("at start: remaining %v", r)
	}
	if r := v.remaining(299 * time.Millisecond); r != time.Millisecond {
		t.Fatalf("at 299ms: remaining %v", r)
	}
	if r := v.remaining(300 * time.Millisecond); r > 0 {
		t.Fatalf("at 300ms without an ack: remaining %v, want dead", r)
	}
	// Slow daemon: every ack arrives 1.5 intervals after its heartbeat
	// (heartbeat k sent at k×every, acked at (k+1.5)×every): the link never
	// dies, the deadline stays ≥ 1.5 intervals ahead once acks flow.
	for k := 1; k <= 20; k++ {
		at := time.Duration(k)*every + every*3/2
		now := at
		if r := v.remaining(now); r <= 0 {
			t.Fatalf("heartbeat %d: dead at %v before its late ack", k, now)
		}
		v.acked(at)
		if r := v.remaining(now); r != 300*time.Millisecond {
			t.Fatalf("heartbeat %d: remaining %v after the ack, want 300ms", k, r)
		}
	}
	last := 21*every + every/2
	// An ack of an older heartbeat arriving out of order does not move
	// the deadline back.
	v.acked(last - 5*every)
	if r := v.remaining(last); r != 300*time.Millisecond {
		t.Fatalf("an older ack moved the deadline: remaining %v", r)
	}
	// The path goes dark after the last ack: dead exactly 3 intervals later.
	if r := v.remaining(last + 3*every - time.Nanosecond); r <= 0 {
		t.Fatal("dead before 3 intervals")
	}
	if r := v.remaining(last + 3*every); r > 0 {
		t.Fatalf("alive 3 intervals after the last ack: remaining %v", r)
	}
}

func TestHeartbeatMissesConfig(t *testing.T) {
	for _, c := range []struct{ in, want int }{{0, DefaultHeartbeatMisses}, {-1, 0}, {1, 1}, {5, 5}} {
		cfg := Config{HeartbeatMisses: c.in}
		if got := cfg.heartbeatMisses(); got != c.want {
			t.Errorf("HeartbeatMisses %d: %d, want %d", c.in, got, c.want)
		}
	}
	if w := newLiveness(0, time.Second).window; w != 0 {
		t.Errorf("misses 0: window %v, want 0 (off)", w)
	}
}
