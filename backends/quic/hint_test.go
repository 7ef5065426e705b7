package quic

import (
	"bytes"
	"context"
	"io"
	"testing"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// TestDelayHint: with the DelayHint (Config.DelayHintMaxRTT) the scheduler sees the queue that a
// saturating bulk transfer builds (HintWaits > 0) and the data arrives
// intact; without it the connection reports nothing queued and the
// scheduler never waits on the hint.
func TestDelayHint(t *testing.T) {
	for _, on := range []bool{false, true} {
		th := -1 // DelayHint off (the default)
		if on {
			th = 16 << 10 // low, so that a loopback queue reliably crosses it
		}
		c, s := oursPairHint(t, Config{}, th)
		st, err := c.OpenUniStream(context.Background(), wire.StreamCasUpload)
		if err != nil {
			t.Fatal(err)
		}
		want := bytes.Repeat([]byte("forgeyard delay hint "), (16<<20)/21)
		done := make(chan error, 1)
		go func() {
			_, err := st.Write(want)
			if err == nil {
				err = st.Close()
			}
			done <- err
		}()
		rs, err := s.AcceptUniStream(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rs)
		if err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("DelayHint=%v: received %d bytes, not the %d sent", on, len(got), len(want))
		}
		hw := c.Stats().Sched.HintWaits
		t.Logf("DelayHint=%v: %d hint waits for %d MiB", on, hw, len(want)>>20)
		if on && hw == 0 {
			t.Errorf("DelayHint on: the scheduler never waited on the hint during a 16 MiB transfer")
		}
		if !on && hw != 0 {
			t.Errorf("DelayHint off: %d hint waits", hw)
		}
	}
}

var _ semantics.BulkHinter = (*DelayHint)(nil)
