package yamux

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	hyamux "github.com/hashicorp/yamux"

	"forgeyard.dev/transport/internal/stats"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// Benchmarks (loopback). Run, e.g.:
//
//	go test -run '^$' -bench . -benchtime 2000x -count 3 ./backends/yamux
//
// "raw" is hashicorp/yamux over TLS 1.3 with no project code (16 MiB
// window, 64 KiB application writes); "backend" is this package's
// BackendConn used directly; "ours" is semantics.Conn over this backend
// (priority scheduler, 16 KiB bulk chunks, BulkHinter).

const benchServerName = "localhost"

// rawYamuxPair returns two hashicorp/yamux sessions over TLS 1.3 on
// loopback with ycfg (client, server).
func rawYamuxPair(tb testing.TB, ycfg *hyamux.Config) (client, server *hyamux.Session) {
	tb.Helper()
	pki := trusttest.NewPKI(tb)
	sconf := tlsConfig(pki.ServerConfig(tb, benchServerName))
	cconf := tlsConfig(pki.ClientConfig(tb, wire.NewRunnerId(), benchServerName))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		s   *hyamux.Session
		err error
	}
	ch := make(chan res, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			ch <- res{nil, err}
			return
		}
		tc := tls.Server(nc, sconf)
		if err := tc.Handshake(); err != nil {
			ch <- res{nil, err}
			return
		}
		s, err := hyamux.Server(tc, ycfg)
		ch <- res{s, err}
	}()
	tc, err := tls.Dial("tcp", ln.Addr().String(), cconf)
	if err != nil {
		tb.Fatal(err)
	}
	client, err = hyamux.Client(tc, ycfg)
	if err != nil {
		tb.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		tb.Fatal(r.err)
	}
	server = r.s
	tb.Cleanup(func() {
		_ = client.Close()
		_ = server.Close()
	})
	return client, server
}

func rawYamuxConfig() *hyamux.Config {
	c := hyamux.DefaultConfig()
	c.MaxStreamWindowSize = 16 << 20
	c.LogOutput = io.Discard
	return c
}

// backendPair returns two of this package's Conns (client, server).
func backendPair(tb testing.TB, cfg Config) (client, server *Conn) {
	p := newPair(tb, cfg)
	return p.client, p.server
}

// oursPair wraps a backend pair in semantics.Conns.
func oursPair(tb testing.TB, cfg Config, scfg semantics.Config) (client, server *semantics.Conn) {
	tb.Helper()
	bc, bs := backendPair(tb, cfg)
	scfg.Limits.MaxStreamsPerKind[wire.StreamCasUpload] = 8
	client, err := semantics.NewConn(bc, scfg)
	if err != nil {
		tb.Fatal(err)
	}
	server, err = semantics.NewConn(bs, scfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = client.CloseWithCode(wire.CloseNormal, "")
		_ = server.CloseWithCode(wire.CloseNormal, "")
	})
	return client, server
}

// pingStream is a 64-byte echo on a long-lived stream.
type pingStream struct {
	w   io.Writer
	r   io.Reader
	buf [64]byte
}

func (p *pingStream) rtt() (time.Duration, error) {
	start := time.Now()
	if _, err := p.w.Write(p.buf[:]); err != nil {
		return 0, err
	}
	if _, err := io.ReadFull(p.r, p.buf[:]); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// newPing starts an echo on the accepted side and does one round trip.
func newPing(tb testing.TB, w io.Writer, r io.Reader, peer io.ReadWriter) *pingStream {
	tb.Helper()
	go func() { _, _ = io.Copy(peer, peer) }()
	p := &pingStream{w: w, r: r}
	if _, err := p.rtt(); err != nil {
		tb.Fatal(err)
	}
	return p
}

func rawPing(tb testing.TB, c, s *hyamux.Session) *pingStream {
	st, err := c.OpenStream()
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := st.Write(make([]byte, 64)); err != nil {
		tb.Fatal(err)
	}
	ps, err := s.AcceptStream()
	if err != nil {
		tb.Fatal(err)
	}
	p := &pingStream{w: st, r: st}
	if _, err := io.ReadFull(ps, p.buf[:]); err != nil {
		tb.Fatal(err)
	}
	return newPing(tb, st, st, ps)
}

func backendPing(tb testing.TB, c, s *Conn) *pingStream {
	ctx := context.Background()
	st, err := c.OpenStream(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	ps, err := s.AcceptStream(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	return newPing(tb, st, st, ps)
}

func oursPing(tb testing.TB, c, s *semantics.Conn) *pingStream {
	ctx := context.Background()
	st, err := c.OpenStream(ctx, wire.StreamControl)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := st.Write(make([]byte, 64)); err != nil {
		tb.Fatal(err)
	}
	ps, err := s.AcceptStream(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	var first [64]byte
	if _, err := io.ReadFull(ps, first[:]); err != nil {
		tb.Fatal(err)
	}
	return newPing(tb, st, st, ps)
}

// bulk runs one writer per stream until halt and counts received bytes.
type bulk struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	received atomic.Int64
}

func (bk *bulk) halt() {
	close(bk.stop)
	bk.wg.Wait()
}

// startBulk starts n streams; open(i) returns a writer and the peer's
// reader. Writers write chunk-sized buffers until halt.
func startBulk(tb testing.TB, n, chunk int, open func(i int) (io.WriteCloser, io.Reader)) *bulk {
	bk := &bulk{stop: make(chan struct{})}
	for i := range n {
		w, r := open(i)
		bk.wg.Add(2)
		go func() {
			defer bk.wg.Done()
			buf := make([]byte, 64<<10)
			for {
				m, err := r.Read(buf)
				bk.received.Add(int64(m))
				if err != nil {
					return
				}
			}
		}()
		go func() {
			defer bk.wg.Done()
			b := make([]byte, chunk)
			for {
				select {
				case <-bk.stop:
					_ = w.Close()
					return
				default:
				}
				if _, err := w.Write(b); err != nil {
					return
				}
			}
		}()
	}
	return bk
}

func rawBulk(tb testing.TB, c, s *hyamux.Session, n int) *bulk {
	return startBulk(tb, n, 64<<10, func(int) (io.WriteCloser, io.Reader) {
		st, err := c.OpenStream()
		if err != nil {
			tb.Fatal(err)
		}
		rs, err := s.AcceptStream()
		if err != nil {
			tb.Fatal(err)
		}
		return st, rs
	})
}

func backendBulk(tb testing.TB, c, s *Conn, n int) *bulk {
	return startBulk(tb, n, 64<<10, func(int) (io.WriteCloser, io.Reader) {
		st, err := c.OpenUniStream(context.Background())
		if err != nil {
			tb.Fatal(err)
		}
		rs, err := s.AcceptUniStream(context.Background())
		if err != nil {
			tb.Fatal(err)
		}
		return st, rs
	})
}

func oursBulk(tb testing.TB, c, s *semantics.Conn, n int) *bulk {
	return startBulk(tb, n, 64<<10, func(int) (io.WriteCloser, io.Reader) {
		st, err := c.OpenUniStream(context.Background(), wire.StreamCasUpload)
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := st.Write([]byte{1}); err != nil {
			tb.Fatal(err)
		}
		rs, err := s.AcceptUniStream(context.Background())
		if err != nil {
			tb.Fatal(err)
		}
		return st, rs
	})
}

// measurePings does max(b.N, 200) round trips and reports p50/p99 in µs.
func measurePings(b *testing.B, p *pingStream) {
	n := max(b.N, 200)
	rtts := make([]time.Duration, 0, n)
	b.ResetTimer()
	for range n {
		d, err := p.rtt()
		if err != nil {
			b.Fatal(err)
		}
		rtts = append(rtts, d)
	}
	b.StopTimer()
	slices.Sort(rtts)
	b.ReportMetric(float64(stats.Percentile(rtts, 50).Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(stats.Percentile(rtts, 99).Nanoseconds())/1e3, "p99-µs")
	b.ReportMetric(0, "ns/op")
}

func BenchmarkControlRTT(b *testing.B) {
	b.Run("raw", func(b *testing.B) {
		c, s := rawYamuxPair(b, rawYamuxConfig())
		measurePings(b, rawPing(b, c, s))
	})
	b.Run("ours", func(b *testing.B) {
		c, s := oursPair(b, Config{}, semantics.Config{})
		measurePings(b, oursPing(b, c, s))
	})
}

// BenchmarkBulk measures throughput on 1 and 4 streams.
func BenchmarkBulk(b *testing.B) {
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("raw/streams=%d", n), func(b *testing.B) {
			c, s := rawYamuxPair(b, rawYamuxConfig())
			runBulk(b, rawBulk(b, c, s, n))
		})
		b.Run(fmt.Sprintf("ours/streams=%d", n), func(b *testing.B) {
			c, s := oursPair(b, Config{}, semantics.Config{})
			runBulk(b, oursBulk(b, c, s, n))
		})
	}
}

// runBulk lets bk run for b.N × 1 ms (at least 300 ms) and reports MB/s
// and the process's CPU time (user+system, both ends of the connection
// live in this process) per GiB received, which other load on a shared
// machine inflates far less than it deflates MB/s.
func runBulk(b *testing.B, bk *bulk) {
	d := max(time.Duration(b.N)*time.Millisecond, 300*time.Millisecond)
	time.Sleep(50 * time.Millisecond) // warm-up: let windows open
	r0, t0, c0 := bk.received.Load(), time.Now(), cpuTime()
	b.ResetTimer()
	time.Sleep(d) // the measurement interval itself
	el, r1, c1 := time.Since(t0), bk.received.Load(), cpuTime()
	b.StopTimer()
	bk.halt()
	b.ReportMetric(float64(r1-r0)/el.Seconds()/1e6, "MB/s")
	reportCPUPerGiB(b, c1-c0, r1-r0)
	b.ReportMetric(0, "ns/op")
}

// reportCPUPerGiB reports cpu seconds per GiB of n bytes.
func reportCPUPerGiB(b *testing.B, cpu time.Duration, n int64) {
	if n > 0 && cpu > 0 {
		b.ReportMetric(cpu.Seconds()/(float64(n)/(1<<30)), "cpu-s/GiB")
	}
}

// controlUnderBulk measures pings while one bulk stream saturates.
func controlUnderBulk(b *testing.B, p *pingStream, bk *bulk) {
	time.Sleep(100 * time.Millisecond) // let the bulk stream fill every queue
	r0, t0, c0 := bk.received.Load(), time.Now(), cpuTime()
	measurePings(b, p)
	el, r1, c1 := time.Since(t0), bk.received.Load(), cpuTime()
	bk.halt()
	b.ReportMetric(float64(r1-r0)/el.Seconds()/1e6, "bulk-MB/s")
	reportCPUPerGiB(b, c1-c0, r1-r0)
}

func BenchmarkControlUnderBulk(b *testing.B) {
	b.Run("raw", func(b *testing.B) {
		c, s := rawYamuxPair(b, rawYamuxConfig())
		p := rawPing(b, c, s)
		controlUnderBulk(b, p, rawBulk(b, c, s, 1))
	})
	for _, v := range underBulkVariants {
		b.Run(v.name, func(b *testing.B) {
			if v.semantics {
				c, s := oursPair(b, v.cfg, v.scfg)
				p := oursPing(b, c, s)
				controlUnderBulk(b, p, oursBulk(b, c, s, 1))
				return
			}
			c, s := backendPair(b, v.cfg)
			p := backendPing(b, c, s)
			controlUnderBulk(b, p, backendBulk(b, c, s, 1))
		})
	}
}

type variant struct {
	name      string
	semantics bool
	cfg       Config
	scfg      semantics.Config
}

func chunk(n int) semantics.Config {
	var c semantics.Config
	c.Limits.BulkChunk = n
	return c
}

func chunkNoHint(n int) semantics.Config {
	c := chunk(n)
	c.BulkQueueThreshold = -1
	return c
}

// underBulkVariants are the configurations compared in
// docs/perf/backends-yamux.md.
var underBulkVariants = []variant{
	{name: "backend/lowat=128K", cfg: Config{}},
	{name: "ours", semantics: true, cfg: Config{}},
	{name: "ours/lowat=off", semantics: true, cfg: Config{NotSentLowat: -1}},
	{name: "ours/hint=off", semantics: true, cfg: Config{}, scfg: chunkNoHint(0)},
	{name: "ours/lowat=32K", semantics: true, cfg: Config{NotSentLowat: 32 << 10}},
	{name: "ours/lowat=32K/chunk=32K", semantics: true, cfg: Config{NotSentLowat: 32 << 10}, scfg: chunk(32 << 10)},
	{name: "ours/chunk=64K", semantics: true, cfg: Config{}, scfg: chunk(64 << 10)},
	{name: "ours/chunk=64K/rcvbuf=256K", semantics: true, cfg: Config{RecvBuffer: 256 << 10}, scfg: chunk(64 << 10)},
	{name: "ours/thr=32K", semantics: true, cfg: Config{}, scfg: semantics.Config{BulkQueueThreshold: 32 << 10}},
	{name: "ours/thr=16K", semantics: true, cfg: Config{}, scfg: semantics.Config{BulkQueueThreshold: 16 << 10}},
	{name: "ours/thr=32K/lowat=64K", semantics: true, cfg: Config{NotSentLowat: 64 << 10}, scfg: semantics.Config{BulkQueueThreshold: 32 << 10}},
}
