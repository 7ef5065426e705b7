package yamux

import (
	"runtime"
	"strings"
	"testing"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// TestHandleStreamsPushed: over yamux, semantics.Conn's stream handlers
// get the peer's streams from the backend's own classify goroutines
// (semantics.StreamPusher), streams opened before the handlers existed
// included, and no goroutine waits in semantics' accept loops for the next
// one (issue 26 item 1: two goroutines less per idle connection).
func TestHandleStreamsPushed(t *testing.T) {
	p := newPair(t, Config{})
	ctx := ctxT(t)
	c, err := semantics.NewConn(p.client, semantics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := semantics.NewConn(p.server, semantics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	open := func(i byte) {
		t.Helper()
		st, err := c.OpenStream(ctx, wire.StreamDiagnostic)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.WriteFrame(func(b []byte) []byte { return append(b, 'b', i) }); err != nil {
			t.Fatal(err)
		}
		us, err := c.OpenUniStream(ctx, wire.StreamLog)
		if err != nil {
			t.Fatal(err)
		}
		if err := us.WriteFrame(func(b []byte) []byte { return append(b, 'u', i) }); err != nil {
			t.Fatal(err)
		}
	}
	open(1) // before the handlers: waits in yamux's backlog
	got := make(chan string, 4)
	read := func(f []byte, err error) {
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		got <- string(f)
	}
	s.HandleStreams(func(st *semantics.Stream) { read(st.ReadFrame()) })
	s.HandleUniStreams(func(st *semantics.RecvStream) { read(st.ReadFrame()) })
	open(2)
	want := map[string]bool{"b\x01": true, "u\x01": true, "b\x02": true, "u\x02": true}
	for range 4 {
		select {
		case f := <-got:
			if !want[f] {
				t.Fatalf("handler read %q, want one of the 4 frames once", f)
			}
			delete(want, f)
		case <-ctx.Done():
			t.Fatalf("handlers got %d of 4 streams", 4-len(want))
		}
	}
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	if n := strings.Count(stacks, "semantics.(*Conn).acceptLoop"); n > 0 {
		t.Fatalf("%d goroutines in semantics' accept loops: the backend's push was not used", n)
	}
}
