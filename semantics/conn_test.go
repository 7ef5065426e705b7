package semantics_test

import (
	"context"
	"errors"
	"io"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/backendtest"
	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

func pipeConns(t *testing.T, opts memory.Options, cfg semantics.Config) (*semantics.Conn, *semantics.Conn, *memory.Conn) {
	t.Helper()
	bc, bs := memory.Pipe(opts)
	c, err := semantics.NewConn(bc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := semantics.NewConn(bs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.CloseWithCode(wire.CloseNormal, "")
		_ = s.CloseWithCode(wire.CloseNormal, "")
	})
	return c, s, bc
}

func TestNewConnConfig(t *testing.T) {
	if _, err := semantics.NewConn(nil, semantics.Config{}); err == nil {
		t.Fatal("nil BackendConn accepted")
	}
	bc, bs := memory.Pipe(memory.Options{})
	defer bs.CloseWithCode(0, "")
	var bad semantics.Config
	bad.Limits.MaxStreams = -1
	if _, err := semantics.NewConn(bc, bad); err == nil {
		t.Fatal("negative MaxStreams accepted")
	}
	if _, err := semantics.NewConn(bc, semantics.Config{BulkMaxWait: -1}); err == nil {
		t.Fatal("negative BulkMaxWait accepted")
	}
	cfg := semantics.Config{}
	cfg.Limits.MaxStreamsPerKind[wire.StreamLog] = 3
	c, err := semantics.NewConn(bc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseWithCode(0, "")
	cfg.Limits.MaxStreamsPerKind[wire.StreamLog] = 99 // copied on entry
	l := c.Limits()
	if l.MaxStreamsPerKind[wire.StreamLog] != 3 || l.MaxStreams != semantics.DefaultMaxStreams || l.BulkChunk != semantics.DefaultBulkChunk {
		t.Fatalf("effective limits %+v", l)
	}
}

func TestPriorities(t *testing.T) {
	c, s, _ := pipeConns(t, memory.Options{}, semantics.Config{})
	ctx := context.Background()
	lg, err := c.OpenUniStream(ctx, wire.StreamLog)
	if err != nil {
		t.Fatal(err)
	}
	if lg.Priority() != semantics.PriorityLog {
		t.Fatalf("log stream priority %s", lg.Priority())
	}
	lg.SetPriority(semantics.PriorityCancel)
	if lg.Priority() != semantics.PriorityCancel {
		t.Fatalf("SetPriority: %s", lg.Priority())
	}
	lg.SetPriority(200)
	if lg.Priority() != semantics.PriorityCAS {
		t.Fatalf("out-of-range priority not clipped: %s", lg.Priority())
	}
	if _, err := lg.Write([]byte("abc")); err != nil {
		t.Fatal(err)
	}
	rs, err := s.AcceptUniStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 3)
	if _, err := io.ReadFull(rs, buf); err != nil || string(buf) != "abc" {
		t.Fatalf("read %q %v", buf, err)
	}
	if w := c.Stats().Sched.Written[semantics.PriorityCAS]; w != 3 {
		t.Fatalf("Written[cas] = %d, want 3", w)
	}
}

// TestBidiSlotNeedsBothHalves: a bidi stream holds its slot until both the
// send half and the receive half are done.
func TestBidiSlotNeedsBothHalves(t *testing.T) {
	c, s, _ := pipeConns(t, memory.Options{}, semantics.Config{})
	ctx := context.Background()
	st, err := c.OpenStream(ctx, wire.StreamControl)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := s.AcceptStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tryOpen := func() error {
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		st2, err := c.OpenStream(short, wire.StreamControl)
		if err == nil {
			st2.CancelWrite(0)
			st2.CancelRead(0)
		}
		return err
	}
	_ = st.Close()
	var le *semantics.LimitError
	if err := tryOpen(); !errors.As(err, &le) {
		t.Fatalf("open with the send half closed but the receive half open: %v", err)
	}
	if got := s.Stats().OpenIncoming[wire.StreamControl]; got != 1 {
		t.Fatalf("server OpenIncoming[control] = %d, want 1", got)
	}
	if _, err := io.ReadAll(peer); err != nil {
		t.Fatal(err)
	}
	_ = peer.Close()
	if got := s.Stats().OpenIncoming[wire.StreamControl]; got != 0 {
		t.Fatalf("server OpenIncoming[control] = %d after both halves, want 0", got)
	}
	if _, err := io.ReadAll(st); err != nil {
		t.Fatal(err)
	}
	if err := tryOpen(); err != nil {
		t.Fatalf("open after both halves finished: %v", err)
	}
}

// TestControlUnderBandwidthLimit shows the scheduler at work on a link whose
// queue is shared by every stream (a bandwidth-limited memory pipe, like a
// kernel socket buffer): raw streams let a control round trip wait behind
// the whole bulk window; semantics.Conn, pacing bulk on QueuedBytes, keeps
// it short.
func TestControlUnderBandwidthLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("timing test: several seconds")
	}
	const n = 40
	opts := memory.Options{Bandwidth: 32e6, StreamWindow: 1 << 20, SendBuffer: 1 << 20}
	// The raw run is the precondition (the link queues bulk data ahead of
	// control); on a starved machine the bulk sender may not keep the link
	// full for a whole run, so it is measured up to 3 times.
	var rawP50, rawP99 time.Duration
	for try := 1; ; try++ {
		rawP50, rawP99 = rawControlUnderBulk(t, opts, n)
		if rawP50 >= 20*time.Millisecond || try == 3 {
			break
		}
		t.Logf("raw try %d: p50 %v, p99 %v: the bulk sender did not keep the link queued; measuring again", try, rawP50, rawP99)
	}
	c, s, _ := pipeConns(t, opts, semantics.Config{})
	// 200 loaded samples, so that the p99 (nearest rank: the third
	// largest) is a tail, not the one worst moment of a starved machine.
	r := backendtest.MeasureControlUnderBulk(t, c, s, 5*n)
	st := c.Stats().Sched
	t.Logf("32 MB/s link, 1 MiB send buffer and stream window: raw control RTT p50 %v p99 %v; semantics.Conn p50 %v p99 %v (idle %v), bulk %.1f MB/s, hint waits %d",
		rawP50, rawP99, r.P50, r.P99, r.IdleP50, r.BulkMBps, st.HintWaits)
	if rawP50 < 20*time.Millisecond {
		t.Fatalf("raw p50 %v: the link did not queue bulk data; the test shows nothing", rawP50)
	}
	// Expected: raw ≈ 32 ms (1 MiB at 32 MB/s), ours ≈ 1–5 ms. Relative
	// bounds keep the test meaningful on a loaded machine.
	if r.P50 > rawP50/5 || r.P99 > rawP50 {
		t.Fatalf("semantics.Conn control p50 %v p99 %v under bulk; want p50 ≤ raw p50/5 (%v) and p99 ≤ raw p50", r.P50, r.P99, rawP50/5)
	}
	if st.HintWaits == 0 {
		t.Fatal("bulk writer never waited on QueuedBytes")
	}
	if r.BulkMBps < 8 {
		t.Fatalf("bulk throughput %.1f MB/s: pacing starved the bulk stream", r.BulkMBps)
	}
}

// rawControlUnderBulk measures control round trips over raw memory streams
// while one raw stream writes bulk data.
func rawControlUnderBulk(t *testing.T, opts memory.Options, n int) (p50, p99 time.Duration) {
	t.Helper()
	c, s := memory.Pipe(opts)
	defer c.CloseWithCode(0, "")
	defer s.CloseWithCode(0, "")
	ctx := context.Background()
	ctl, _ := c.OpenStream(ctx)
	peer, _ := s.AcceptStream(ctx)
	bulk, _ := c.OpenUniStream(ctx)
	brs, _ := s.AcceptUniStream(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(3)
	go func() { defer wg.Done(); _, _ = io.Copy(peer, peer) }()
	go func() { defer wg.Done(); _, _ = io.Copy(io.Discard, brs) }()
	stop := make(chan struct{})
	go func() {
		defer wg.Done()
		chunk := make([]byte, 256<<10)
		for {
			select {
			case <-stop:
				_ = bulk.Close()
				return
			default:
			}
			if _, err := bulk.Write(chunk); err != nil {
				return
			}
		}
	}()
	for i := 0; i < 1000 && c.QueuedBytes() < 512<<10; i++ {
		time.Sleep(time.Millisecond) // polling: no event marks "link queue full"
	}
	ping := make([]byte, 64)
	var rtts []time.Duration
	for i := 0; i < n; i++ {
		start := time.Now()
		if _, err := ctl.Write(ping); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(ctl, ping); err != nil {
			t.Fatal(err)
		}
		rtts = append(rtts, time.Since(start))
	}
	close(stop)
	_ = ctl.Close()
	slices.Sort(rtts)
	return rtts[n/2], rtts[n*99/100]
}

// TestAcceptStartsLazily: NewConn starts no goroutine; streams the peer
// opens before the first Accept call wait in the backend unchecked; the
// first AcceptStream starts the loop, which then keeps enforcing limits
// with no Accept call waiting.
func TestAcceptStartsLazily(t *testing.T) {
	bc, bs := memory.Pipe(memory.Options{})
	c, err := semantics.NewConn(bc, semantics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseWithCode(wire.CloseNormal, "")
	var cfg semantics.Config
	cfg.Limits.MaxStreamsPerKind[wire.StreamDiagnostic] = 1
	g0 := runtime.NumGoroutine()
	s, err := semantics.NewConn(bs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.CloseWithCode(wire.CloseNormal, "")
	if g := runtime.NumGoroutine(); g > g0 {
		t.Fatalf("NewConn started %d goroutines, want none", g-g0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, err := c.OpenStream(ctx, wire.StreamDiagnostic)
	if err != nil {
		t.Fatal(err)
	}
	second, err := c.OpenStream(ctx, wire.StreamDiagnostic)
	if err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Refused != 0 || st.OpenIncoming != ([wire.NumStreamKinds]int{}) {
		t.Fatalf("streams checked before any Accept call: %+v", st)
	}
	peer, err := s.AcceptStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := peer.WriteFrame(func(b []byte) []byte { return append(b, "hi"...) }); err != nil {
		t.Fatal(err)
	}
	// The loop keeps running: of the two streams (headers are checked
	// concurrently, so either may win) one is admitted and the other, over
	// the limit of 1, is refused although no Accept call is waiting.
	admitted, refused := 0, 0
	for _, st := range []*semantics.Stream{first, second} {
		_ = st.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := st.ReadFrame()
		var se *semantics.StreamError
		switch {
		case err == nil && string(got) == "hi":
			admitted++
		case errors.As(err, &se) && se.Code == semantics.StreamRefused && se.Remote:
			refused++
		default:
			t.Fatalf("client stream: %q %v, want the peer's frame or a remote StreamRefused", got, err)
		}
	}
	if admitted != 1 || refused != 1 {
		t.Fatalf("%d admitted and %d refused, want 1 and 1", admitted, refused)
	}
	if got := s.Stats().Refused; got != 1 {
		t.Fatalf("Stats().Refused = %d, want 1", got)
	}
}

// chunkyConn is a backend that asks for a bulk chunk of its own.
type chunkyConn struct {
	*memory.Conn
	chunk int
}

func (c chunkyConn) PreferredBulkChunk() int { return c.chunk }

func TestBulkChunkHint(t *testing.T) {
	bc, bs := memory.Pipe(memory.Options{})
	defer bs.CloseWithCode(0, "")
	defer bc.CloseWithCode(0, "")
	for _, tc := range []struct {
		name       string
		hint, conf int
		want       int
	}{
		{"hint taken when BulkChunk is unset", 64 << 10, 0, 64 << 10},
		{"configured BulkChunk wins", 64 << 10, 8 << 10, 8 << 10},
		{"no preference", 0, 0, semantics.DefaultBulkChunk},
		{"negative hint ignored", -1, 0, semantics.DefaultBulkChunk},
	} {
		var cfg semantics.Config
		cfg.Limits.BulkChunk = tc.conf
		c, err := semantics.NewConn(chunkyConn{bc, tc.hint}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Limits().BulkChunk; got != tc.want {
			t.Errorf("%s: BulkChunk %d, want %d", tc.name, got, tc.want)
		}
	}
}
