package semantics_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// TestHandleStreams: streams queued before HandleStreams and opened after
// it all reach the handler, in both directions, and Accept then says the
// streams are handled. (The goroutines this saves an idle connection are
// counted by semantics/daemon's TestIdleConnMemory.)
func TestHandleStreams(t *testing.T) {
	bc, bs := memory.Pipe(memory.Options{})
	c, err := semantics.NewConn(bc, semantics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseWithCode(wire.CloseNormal, "")
	obs := &openedObserver{opened: make(chan semantics.StreamKind, 8)}
	s, err := semantics.NewConn(bs, semantics.Config{Metrics: obs})
	if err != nil {
		t.Fatal(err)
	}
	defer s.CloseWithCode(wire.CloseNormal, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The accept loops start with the first Accept call: start them, and
	// queue one stream of each direction before the handler exists.
	actx, acancel := context.WithCancel(ctx)
	acancel()
	_, _ = s.AcceptStream(actx)
	_, _ = s.AcceptUniStream(actx)
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
	open(1)
	// Wait until both are admitted (queued for Accept, or being queued:
	// either way they must reach the handler).
	for range 2 {
		select {
		case <-obs.opened:
		case <-ctx.Done():
			t.Fatalf("streams not admitted: %+v", s.Stats())
		}
	}
	got := make(chan string, 4)
	s.HandleStreams(func(st *semantics.Stream) {
		f, err := st.ReadFrame()
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		got <- string(f)
	})
	s.HandleUniStreams(func(st *semantics.RecvStream) {
		f, err := st.ReadFrame()
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		got <- string(f)
	})
	open(2)
	seen := map[string]bool{}
	for range 4 {
		select {
		case g := <-got:
			seen[g] = true
		case <-ctx.Done():
			t.Fatalf("handled %v, want b1 u1 b2 u2", seen)
		}
	}
	for _, w := range []string{"b\x01", "u\x01", "b\x02", "u\x02"} {
		if !seen[w] {
			t.Fatalf("handled %v, want b1 u1 b2 u2", seen)
		}
	}
	if _, err := s.AcceptStream(ctx); !errors.Is(err, semantics.ErrStreamsHandled) {
		t.Fatalf("AcceptStream after HandleStreams: %v, want ErrStreamsHandled", err)
	}
	if _, err := s.AcceptUniStream(ctx); !errors.Is(err, semantics.ErrStreamsHandled) {
		t.Fatalf("AcceptUniStream after HandleUniStreams: %v, want ErrStreamsHandled", err)
	}
}

// openedObserver reports the kinds of the streams that took a slot.
type openedObserver struct{ opened chan semantics.StreamKind }

func (o *openedObserver) StreamOpened(k semantics.StreamKind) { o.opened <- k }
func (o *openedObserver) StreamClosed(semantics.StreamKind)   {}
func (o *openedObserver) BytesIn(semantics.StreamKind, int)   {}
func (o *openedObserver) BytesOut(semantics.StreamKind, int)  {}
func (o *openedObserver) QueueAdd(semantics.WriteClass, int)  {}
