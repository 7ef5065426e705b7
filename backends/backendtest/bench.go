package backendtest

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/stats"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// RunBenchmarks runs the backend benchmarks against f, each over the raw
// BackendConn ("raw") and over semantics.Conn ("ours"):
//
//   - ControlRTT: a 64-byte round trip on a long-lived stream (ns/op = mean
//     RTT; p50-µs and p99-µs).
//   - Bulk1, Bulk4: throughput of 64 KiB writes on 1 and on 4 streams
//     (b.SetBytes, so MB/s is reported).
//   - ControlUnderBulk: b.N 64-byte round trips while one bulk stream
//     saturates the connection; reports p50-µs, p99-µs and bulk-MB/s.
//   - ours/IdleConns: IdleConnMemory for 100 connections (heap-B/conn,
//     rss-B/conn).
//
// Backends add their "raw library" baseline themselves.
func RunBenchmarks(b *testing.B, f Factory) {
	for _, mode := range []string{"raw", "ours"} {
		b.Run(mode+"/ControlRTT", func(b *testing.B) {
			a, z := benchStreams(b, f, mode, wire.StreamControl)
			benchRTT(b, a, z)
		})
		for _, n := range []int{1, 4} {
			b.Run(mode+"/Bulk"+strconv.Itoa(n), func(b *testing.B) { benchBulk(b, f, mode, n) })
		}
		b.Run(mode+"/ControlUnderBulk", func(b *testing.B) { benchControlUnderBulk(b, f, mode) })
	}
	b.Run("ours/IdleConns", func(b *testing.B) {
		var heap, rss float64
		for i := 0; i < b.N; i++ {
			heap, rss = IdleConnMemory(b, f, 100)
		}
		b.ReportMetric(heap, "heap-B/conn")
		b.ReportMetric(rss, "rss-B/conn")
	})
}

// duplex is the part of a stream the benchmarks use.
type duplex interface {
	io.ReadWriter
	Close() error
}

// benchStreams returns a bidi stream (a) and its accepted peer (z), raw or
// over semantics.Conn.
func benchStreams(b *testing.B, f Factory, mode string, kind semantics.StreamKind) (a, z duplex) {
	b.Helper()
	e := newEnv(b, f)
	bc, bs := e.pair(b)
	ctx := testCtx(b)
	if mode == "raw" {
		return rawPair(b, ctx, bc, bs, 1)
	}
	c, s := wrap(b, bc, semantics.Config{}), wrap(b, bs, semantics.Config{})
	return openPair(b, ctx, c, s, kind)
}

// rawPair is rawOpen with hello zero bytes, read by the peer.
func rawPair(b testing.TB, ctx context.Context, bc, bs semantics.BackendConn, hello int) (st, peer semantics.RawStream) {
	b.Helper()
	st, peer = rawOpen(b, ctx, bc, bs, make([]byte, hello))
	if _, err := io.ReadFull(peer, make([]byte, hello)); err != nil {
		b.Fatal(err)
	}
	return st, peer
}

// roundTrip writes msg on s and reads the echo back into it; it returns
// how long that took.
func roundTrip(b *testing.B, s duplex, msg []byte) time.Duration {
	t0 := time.Now()
	if _, err := s.Write(msg); err != nil {
		b.Fatal(err)
	}
	if _, err := io.ReadFull(s, msg); err != nil {
		b.Fatal(err)
	}
	return time.Since(t0)
}

// echo copies 64-byte messages back until the stream ends.
func echo(z duplex, wg *sync.WaitGroup) {
	defer wg.Done()
	buf := make([]byte, 64)
	for {
		if _, err := io.ReadFull(z, buf); err != nil {
			return
		}
		if _, err := z.Write(buf); err != nil {
			return
		}
	}
}

func benchRTT(b *testing.B, a, z duplex) {
	var wg sync.WaitGroup
	wg.Add(1)
	go echo(z, &wg)
	msg := make([]byte, 64)
	rtts := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rtts = append(rtts, roundTrip(b, a, msg))
	}
	b.StopTimer()
	slices.Sort(rtts)
	b.ReportMetric(float64(stats.Percentile(rtts, 50).Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(stats.Percentile(rtts, 99).Nanoseconds())/1e3, "p99-µs")
	_ = a.Close()
	_ = z.Close()
	wg.Wait()
}

// bulkPair opens n uni streams from client to server (raw or ours) and
// starts discarding readers; wait blocks until they saw EOF.
func bulkPair(b *testing.B, f Factory, mode string, n int) (writers []io.WriteCloser, ours [2]*semantics.Conn, wait func()) {
	b.Helper()
	e := newEnv(b, f)
	bc, bs := e.pair(b)
	ctx := testCtx(b)
	var wg sync.WaitGroup
	if mode == "ours" {
		ours[0], ours[1] = wrap(b, bc, semantics.Config{}), wrap(b, bs, semantics.Config{})
	}
	for i := 0; i < n; i++ {
		var r io.Reader
		if mode == "raw" {
			st, rs := rawOpenUni(b, ctx, bc, bs, []byte{0})
			writers, r = append(writers, st), rs
		} else {
			st, rs := openUniPair(b, ctx, ours[0], ours[1], wire.StreamCasUpload)
			writers, r = append(writers, st), rs
		}
		wg.Go(func() { _, _ = io.Copy(io.Discard, r) })
	}
	return writers, ours, wg.Wait
}

func benchBulk(b *testing.B, f Factory, mode string, n int) {
	writers, _, wait := bulkPair(b, f, mode, n)
	chunk := make([]byte, 64<<10)
	b.SetBytes(int64(len(chunk)))
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for _, w := range writers {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if _, err := w.Write(chunk); err != nil {
					b.Error(err)
					return
				}
			}
			_ = w.Close()
		})
	}
	wg.Wait()
	wait()
	b.StopTimer()
}

func benchControlUnderBulk(b *testing.B, f Factory, mode string) {
	// Control and bulk share one connection, so they share its queues.
	e := newEnv(b, f)
	bc, bs := e.pair(b)
	ctx := testCtx(b)
	var ctl, peer duplex
	var bulk io.WriteCloser
	var bulkR io.Reader
	var written func() int64
	var sent atomic.Int64
	if mode == "raw" {
		ctl, peer = rawPair(b, ctx, bc, bs, 64)
		bulk, bulkR = rawOpenUni(b, ctx, bc, bs, []byte{0})
		written = sent.Load
	} else {
		c, s := wrap(b, bc, semantics.Config{}), wrap(b, bs, semantics.Config{})
		ctl, peer = openPair(b, ctx, c, s, wire.StreamControl)
		bulk, bulkR = openUniPair(b, ctx, c, s, wire.StreamCasUpload)
		written = func() int64 { return c.Stats().Sched.Written[semantics.PriorityCAS] }
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go echo(peer, &wg)
	go func() { defer wg.Done(); _, _ = io.Copy(io.Discard, bulkR) }()
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
			n, err := bulk.Write(chunk)
			sent.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	for i := 0; i < 1000 && written() < 1<<20; i++ {
		time.Sleep(time.Millisecond) // polling: no event marks "buffers full"
	}
	msg := make([]byte, 64)
	rtts := make([]time.Duration, 0, b.N)
	w0 := written()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		rtts = append(rtts, roundTrip(b, ctl, msg))
	}
	el := time.Since(start)
	b.StopTimer()
	w1 := written()
	close(stop)
	_ = ctl.Close()
	_ = peer.Close()
	_ = bc.CloseWithCode(wire.CloseNormal, "")
	wg.Wait()
	slices.Sort(rtts)
	b.ReportMetric(float64(stats.Percentile(rtts, 50).Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(stats.Percentile(rtts, 99).Nanoseconds())/1e3, "p99-µs")
	b.ReportMetric(float64(w1-w0)/el.Seconds()/1e6, "bulk-MB/s")
}

// IdleConnMemory opens n idle connections — each a semantics.Conn on both
// ends with one open control stream, as an idle agent has — and reports the
// Go heap per connection (after GC) and the process RSS growth per
// connection, in bytes, via t.Logf and as return values. Both ends live in
// this process, so the heap figure covers client and server together: the
// server-side cost is at most that. The connections are closed before it
// returns.
func IdleConnMemory(t testing.TB, f Factory, n int) (heapPerConn, rssPerConn float64) {
	t.Helper()
	e := newEnv(t, f)
	ctx := testCtx(t)
	heap0, rss0 := memNow()
	type pairT struct {
		c, s   *semantics.Conn
		st, pe *semantics.Stream
	}
	pairs := make([]pairT, 0, n)
	defer func() {
		for _, p := range pairs {
			_ = p.c.CloseWithCode(wire.CloseNormal, "")
			_ = p.s.CloseWithCode(wire.CloseNormal, "")
		}
	}()
	for i := 0; i < n; i++ {
		acc := e.startAccept(ctx)
		bc, err := e.dialer(t, e.clientTLS(t, wire.NewRunnerId())).Dial(ctx, e.addr)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		r := <-acc
		if r.err != nil {
			t.Fatalf("accept %d: %v", i, r.err)
		}
		c, err1 := semantics.NewConn(bc, semantics.Config{})
		s, err2 := semantics.NewConn(r.c, semantics.Config{})
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		st, err := c.OpenStream(ctx, wire.StreamControl)
		if err != nil {
			t.Fatal(err)
		}
		pe, err := s.AcceptStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pairs = append(pairs, pairT{c, s, st, pe})
	}
	heap1, rss1 := memNow()
	heapPerConn = float64(int64(heap1)-int64(heap0)) / float64(n)
	rssPerConn = float64(rss1-rss0) / float64(n)
	t.Logf("%s: %d idle connections: Go heap %.0f B/conn (both ends), RSS %+.0f B/conn", f.Name, n, heapPerConn, rssPerConn)
	runtime.KeepAlive(pairs)
	return heapPerConn, rssPerConn
}

// memNow returns HeapAlloc after two GCs and the process VmRSS in bytes
// (0 where /proc is unavailable).
func memNow() (heap uint64, rss int64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, vmRSS()
}

func vmRSS() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Bytes()
		if rest, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			fields := bytes.Fields(rest)
			if len(fields) >= 1 {
				kb, err := strconv.ParseInt(string(fields[0]), 10, 64)
				if err == nil {
					return kb << 10
				}
			}
		}
	}
	return 0
}
