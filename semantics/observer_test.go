package semantics_test

import (
	"bytes"
	"context"
	"io"
	"sync"
	"testing"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// recorder is an Observer that keeps every hook's running totals.
type recorder struct {
	mu                sync.Mutex
	opened, closed    [wire.NumStreamKinds]int
	in, out           [wire.NumStreamKinds]int
	queued, queuedMax [semantics.NumWriteClasses]int
}

func (r *recorder) StreamOpened(k semantics.StreamKind) { r.mu.Lock(); r.opened[k]++; r.mu.Unlock() }
func (r *recorder) StreamClosed(k semantics.StreamKind) { r.mu.Lock(); r.closed[k]++; r.mu.Unlock() }
func (r *recorder) BytesIn(k semantics.StreamKind, n int) {
	r.mu.Lock()
	r.in[k] += n
	r.mu.Unlock()
}
func (r *recorder) BytesOut(k semantics.StreamKind, n int) {
	r.mu.Lock()
	r.out[k] += n
	r.mu.Unlock()
}
func (r *recorder) QueueAdd(c semantics.WriteClass, delta int) {
	r.mu.Lock()
	r.queued[c] += delta
	r.queuedMax[c] = max(r.queuedMax[c], r.queued[c])
	r.mu.Unlock()
}

// exchange opens a control stream (one frame each way) and a log stream
// (bulk bytes one way) from c to s and finishes both, so every slot is
// released when it returns.
func exchange(t *testing.T, c, s *semantics.Conn, bulk []byte) {
	t.Helper()
	ctx := context.Background()
	st, err := c.OpenStream(ctx, wire.StreamControl)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := s.AcceptStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	frame := func(p []byte) []byte { return append(p, "ping"...) }
	if err := st.WriteFrame(frame); err != nil {
		t.Fatal(err)
	}
	if b, err := peer.ReadFrame(); err != nil || string(b) != "ping" {
		t.Fatalf("ReadFrame = %q, %v", b, err)
	}
	if err := peer.WriteFrame(frame); err != nil {
		t.Fatal(err)
	}
	if b, err := st.ReadFrame(); err != nil || string(b) != "ping" {
		t.Fatalf("ReadFrame = %q, %v", b, err)
	}
	_ = st.Close()
	if _, err := io.ReadAll(peer); err != nil {
		t.Fatal(err)
	}
	_ = peer.Close()
	if _, err := io.ReadAll(st); err != nil {
		t.Fatal(err)
	}

	ls, err := c.OpenUniStream(ctx, wire.StreamLog)
	if err != nil {
		t.Fatal(err)
	}
	lr, err := s.AcceptUniStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := ls.Write(bulk)
		if cerr := ls.Close(); err == nil {
			err = cerr
		}
		done <- err
	}()
	got, err := io.ReadAll(lr)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, bulk) {
		t.Fatalf("log stream delivered %d bytes, want %d", len(got), len(bulk))
	}
}

// TestObserverHooks: Config.Metrics sees every stream opened and closed, the
// bytes each side wrote and read, and queue depth by write class returning
// to zero.
func TestObserverHooks(t *testing.T) {
	var cr, sr recorder
	bc, bs := memory.Pipe(memory.Options{})
	c, err := semantics.NewConn(bc, semantics.Config{Metrics: &cr})
	if err != nil {
		t.Fatal(err)
	}
	s, err := semantics.NewConn(bs, semantics.Config{Metrics: &sr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseWithCode(wire.CloseNormal, "")
	defer s.CloseWithCode(wire.CloseNormal, "")
	bulk := bytes.Repeat([]byte("x"), 3*(semantics.Limits{}).WithDefaults().BulkChunk+17)
	exchange(t, c, s, bulk)

	for _, r := range []*recorder{&cr, &sr} {
		r.mu.Lock()
		for _, k := range []wire.StreamKind{wire.StreamControl, wire.StreamLog} {
			if r.opened[k] != 1 || r.closed[k] != 1 {
				t.Errorf("%s streams opened %d closed %d, want 1 and 1", k, r.opened[k], r.closed[k])
			}
		}
		for cl, q := range r.queued {
			if q != 0 {
				t.Errorf("%s queue depth %d after every write returned, want 0", semantics.WriteClass(cl), q)
			}
		}
		r.mu.Unlock()
	}
	// The client wrote two headers, a frame and the bulk bytes; the server
	// read a frame body and the bulk bytes (headers are not stream data).
	if cr.out[wire.StreamLog] < len(bulk) || sr.in[wire.StreamLog] != len(bulk) {
		t.Errorf("log bytes out %d (want ≥ %d), in %d (want %d)", cr.out[wire.StreamLog], len(bulk), sr.in[wire.StreamLog], len(bulk))
	}
	if cr.in[wire.StreamControl] != 4 || sr.in[wire.StreamControl] != 4 || cr.out[wire.StreamControl] == 0 || sr.out[wire.StreamControl] == 0 {
		t.Errorf("control bytes: client in %d out %d, server in %d out %d", cr.in[wire.StreamControl], cr.out[wire.StreamControl], sr.in[wire.StreamControl], sr.out[wire.StreamControl])
	}
	if cr.queuedMax[semantics.ClassLog] == 0 || cr.queuedMax[semantics.ClassControl] == 0 {
		t.Errorf("queue depth never rose: max %v", cr.queuedMax)
	}
	if cr.queuedMax[semantics.ClassCAS] != 0 {
		t.Errorf("CAS queue depth rose to %d without a CAS stream", cr.queuedMax[semantics.ClassCAS])
	}
}

// nilPanics fails the test on any hook call: it stands for an observer
// whose methods are not safe on a nil receiver.
type nilPanics struct{}

func (*nilPanics) StreamOpened(semantics.StreamKind)  { panic("hook called on a nil *nilPanics") }
func (*nilPanics) StreamClosed(semantics.StreamKind)  { panic("hook called on a nil *nilPanics") }
func (*nilPanics) BytesIn(semantics.StreamKind, int)  { panic("hook called on a nil *nilPanics") }
func (*nilPanics) BytesOut(semantics.StreamKind, int) { panic("hook called on a nil *nilPanics") }
func (*nilPanics) QueueAdd(semantics.WriteClass, int) { panic("hook called on a nil *nilPanics") }

// TestNilPointerObserverIsNoObserver: a nil pointer stored in
// Config.Metrics (the typed-nil interface) means no observer, exactly like
// a nil interface: no hook is called.
func TestNilPointerObserverIsNoObserver(t *testing.T) {
	var o semantics.Observer = (*nilPanics)(nil) // a non-nil interface holding a nil pointer
	c, s, _ := pipeConns(t, memory.Options{}, semantics.Config{Metrics: o})
	exchange(t, c, s, bytes.Repeat([]byte("y"), 2*(semantics.Limits{}).WithDefaults().BulkChunk))
}

func TestIsNilObserver(t *testing.T) {
	var nilMap map[int]int
	var nilFunc func()
	cases := []struct {
		o    any
		want bool
	}{
		{nil, true},
		{semantics.Observer(nil), true},
		{semantics.Observer((*nilPanics)(nil)), true},
		{(*recorder)(nil), true},
		{nilMap, true},
		{nilFunc, true},
		{&recorder{}, false},
		{semantics.Observer(&recorder{}), false},
		{struct{}{}, false},
		{0, false},
	}
	for i, c := range cases {
		if got := semantics.IsNilObserver(c.o); got != c.want {
			t.Errorf("case %d (%T): IsNilObserver = %v, want %v", i, c.o, got, c.want)
		}
	}
}

func TestClassOf(t *testing.T) {
	want := map[semantics.Priority]semantics.WriteClass{
		semantics.PriorityCancel:  semantics.ClassControl,
		semantics.PriorityLease:   semantics.ClassControl,
		semantics.PriorityControl: semantics.ClassControl,
		semantics.PriorityLog:     semantics.ClassLog,
		semantics.PriorityCAS:     semantics.ClassCAS,
	}
	for p := semantics.Priority(0); p < semantics.NumPriorities; p++ {
		if got := semantics.ClassOf(p); got != want[p] {
			t.Errorf("ClassOf(%s) = %s, want %s", p, got, want[p])
		}
	}
	if semantics.ClassLog.String() != "log" || semantics.WriteClass(9).String() != "class?" {
		t.Error("WriteClass.String")
	}
	if semantics.OutcomeDuplicate.String() != "duplicate" || semantics.Outcome(9).String() != "unknown" {
		t.Error("Outcome.String")
	}
}
