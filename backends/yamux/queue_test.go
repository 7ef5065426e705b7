package yamux

import (
	"math/rand/v2"
	"syscall"
	"testing"
)

// TestNotSentEstimate drives notSentEstimate with a simulated socket: the
// answer is never below the socket's unsent bytes, most calls of a bulk
// writer read nothing, and a poll (a call with nothing written or begun
// since the previous one) always reads.
func TestNotSentEstimate(t *testing.T) {
	var e notSentEstimate
	var unsent, reads int
	read := func(syscall.RawConn) int { reads++; return unsent }
	var w, seq int64
	calls := 0
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		// The kernel sends some of its queue.
		unsent -= min(unsent, rng.IntN(40<<10))
		got := e.get(w, seq, nil, read)
		calls++
		if got < unsent {
			t.Fatalf("answer %d below the unsent %d", got, unsent)
		}
		if got > 64<<10 {
			// The scheduler waits and polls: nothing written meanwhile.
			unsent -= min(unsent, rng.IntN(64<<10))
			before := reads
			if got := e.get(w, seq, nil, read); got != unsent {
				t.Fatalf("poll answered %d, unsent %d", got, unsent)
			}
			if reads != before+1 {
				t.Fatal("poll did not read")
			}
			continue
		}
		// A 16 KiB chunk is written.
		seq++
		n := 16<<10 + 46
		w += int64(n)
		unsent += n
	}
	if reads > calls/2 {
		t.Errorf("%d reads for %d calls", reads, calls)
	}

	// A threshold below slack: bounds that hold chunks back shrink slack,
	// so the writer soon waits only on real queues.
	var e2 notSentEstimate
	reads, unsent, w, seq = 0, 0, 0, 0
	held := 0
	for i := range 2000 {
		got := e2.get(w, seq, nil, read)
		if got > 16<<10 {
			if i >= 1000 {
				held++
			}
			e2.get(w, seq, nil, read) // the poll: unsent is 0
		}
		seq++
		w += 16<<10 + 46
	}
	t.Logf("held %d, reads %d", held, reads)
	if held > 1000/notSentKeep+1 {
		t.Errorf("a 16 KiB threshold held %d of 1000 chunks back on an empty socket", held)
	}
}
