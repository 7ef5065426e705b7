package quic

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	quicgo "github.com/quic-go/quic-go"

	"forgeyard.dev/transport/internal/stats"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// Benchmarks: raw quic-go (no project layer) against ours (semantics.Conn
// over this backend), on loopback. See docs/perf/backends-quic.md.

// rawPair connects two quic-go connections directly with qcfg.
func rawPair(tb testing.TB, qcfg *quicgo.Config) (client, server *quicgo.Conn) {
	tb.Helper()
	pki := trusttest.NewPKI(tb)
	stc := pki.ServerConfig(tb, serverName)
	stc.NextProtos = []string{ALPN}
	ln, err := quicgo.ListenAddr("127.0.0.1:0", stc, qcfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = ln.Close() })
	ctc := pki.ClientConfig(tb, wire.NewRunnerId(), serverName)
	ctc.NextProtos = []string{ALPN}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acc := make(chan *quicgo.Conn, 1)
	go func() {
		c, err := ln.Accept(ctx)
		if err != nil {
			acc <- nil
			return
		}
		acc <- c
	}()
	client, err = quicgo.DialAddr(ctx, ln.Addr().String(), ctc, qcfg)
	if err != nil {
		tb.Fatal(err)
	}
	server = <-acc
	if server == nil {
		tb.Fatal("accept failed")
	}
	tb.Cleanup(func() {
		_ = client.CloseWithError(0, "")
		_ = server.CloseWithError(0, "")
	})
	return client, server
}

// oursPair connects two semantics.Conns over this backend with cfg.
func oursPair(tb testing.TB, cfg Config) (client, server *semantics.Conn) {
	return oursPairHint(tb, cfg, -1)
}

// oursPairHint is oursPair with the DelayHint on
// (RecommendedDelayHintMaxRTT) when hint ≥ 0, and hint as the scheduler's
// BulkQueueThreshold (0: default).
func oursPairHint(tb testing.TB, cfg Config, hint int) (client, server *semantics.Conn) {
	tb.Helper()
	if hint >= 0 {
		cfg.DelayHintMaxRTT = RecommendedDelayHintMaxRTT
	}
	pki := trusttest.NewPKI(tb)
	ln, err := Listen("127.0.0.1:0", pki.ServerConfig(tb, serverName), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acc := make(chan semantics.BackendConn, 1)
	go func() {
		c, err := ln.Accept(ctx)
		if err != nil {
			acc <- nil
			return
		}
		acc <- c
	}()
	bc, err := Dialer{TLS: pki.ClientConfig(tb, wire.NewRunnerId(), serverName), Config: cfg}.Dial(ctx, ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	bs := <-acc
	if bs == nil {
		tb.Fatal("accept failed")
	}
	var lim semantics.Limits
	lim.MaxStreamsPerKind[wire.StreamCasUpload] = 8
	client, err = semantics.NewConn(bc, semantics.Config{Limits: lim, BulkQueueThreshold: hint})
	if err != nil {
		tb.Fatal(err)
	}
	server, err = semantics.NewConn(bs, semantics.Config{Limits: lim, BulkQueueThreshold: hint})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = client.CloseWithCode(wire.CloseNormal, "")
		_ = server.CloseWithCode(wire.CloseNormal, "")
	})
	return client, server
}

// pingStream is a 64-byte echo on a long-lived stream: rtt does one round
// trip.
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

// rawPing opens a raw echo stream (server echoes 64-byte messages).
func rawPing(tb testing.TB, c, s *quicgo.Conn, urgency int8) *pingStream {
	tb.Helper()
	ctx := context.Background()
	st, err := c.OpenStreamSync(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	if urgency >= 0 {
		st.SetPriority(urgency, false)
	}
	if _, err := st.Write(make([]byte, 64)); err != nil {
		tb.Fatal(err)
	}
	ps, err := s.AcceptStream(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	if urgency >= 0 {
		ps.SetPriority(urgency, false)
	}
	go func() {
		_, _ = io.Copy(ps, ps) // echo
	}()
	p := &pingStream{w: st, r: st}
	if _, err := io.ReadFull(st, p.buf[:]); err != nil { // first echo
		tb.Fatal(err)
	}
	return p
}

// oursPing opens a control stream whose peer echoes raw bytes.
func oursPing(tb testing.TB, c, s *semantics.Conn) *pingStream {
	tb.Helper()
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
	go func() { _, _ = io.Copy(ps, ps) }()
	p := &pingStream{w: st, r: st}
	if _, err := io.ReadFull(st, p.buf[:]); err != nil {
		tb.Fatal(err)
	}
	return p
}

// bulk runs writers (one per stream) until stop and counts bytes received.
type bulk struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	received atomic.Int64
}

func (bk *bulk) halt() {
	close(bk.stop)
	bk.wg.Wait()
}

// startBulk starts n streams: open(i) returns a writer and the peer's
// reader. Writers write 64 KiB chunks until stop.
func startBulk(tb testing.TB, n int, open func(i int) (io.WriteCloser, io.Reader)) *bulk {
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
			chunk := make([]byte, 64<<10)
			for {
				select {
				case <-bk.stop:
					_ = w.Close()
					return
				default:
				}
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}()
	}
	return bk
}

// rawBulk opens n raw uni streams from c to s.
func rawBulk(tb testing.TB, c, s *quicgo.Conn, n int) *bulk {
	return startBulk(tb, n, func(int) (io.WriteCloser, io.Reader) {
		st, err := c.OpenUniStreamSync(context.Background())
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

// oursBulk opens n CAS upload streams from c to s.
func oursBulk(tb testing.TB, c, s *semantics.Conn, n int) *bulk {
	return startBulk(tb, n, func(int) (io.WriteCloser, io.Reader) {
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

// measurePings does b.N round trips (at least minPings) and reports
// p50/p99 in µs.
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

// windows are the receive-window settings the benchmarks compare: quic-go's
// defaults and ours.
type window struct {
	name         string
	stream, conn uint64 // 0: quic-go default (raw) / our default (ours)
}

var benchWindows = []window{
	{"default", 0, 0},
	{"1M-4M", 1 << 20, 4 << 20},
	{"512K-2M", 512 << 10, 2 << 20},
	{"256K-4M", 256 << 10, 4 << 20},
	{"256K-1M", 256 << 10, 1 << 20},
	{"192K-4M", 192 << 10, 4 << 20},
	{"192K-1M", 192 << 10, 1 << 20},
	{"128K-1M", 128 << 10, 1 << 20},
	{"96K-1M", 96 << 10, 1 << 20},
	{"64K-1M", 64 << 10, 1 << 20},
}

func (w window) quic() *quicgo.Config {
	qc := &quicgo.Config{}
	if w.stream != 0 {
		qc.InitialStreamReceiveWindow = min(initialReceiveWindow, w.stream)
		qc.MaxStreamReceiveWindow = w.stream
		qc.InitialConnectionReceiveWindow = min(initialReceiveWindow, w.conn)
		qc.MaxConnectionReceiveWindow = w.conn
	}
	return qc
}

func (w window) ours() Config {
	return Config{StreamReceiveWindow: w.stream, ConnectionReceiveWindow: w.conn}
}

func BenchmarkControlRTT(b *testing.B) {
	b.Run("raw", func(b *testing.B) {
		c, s := rawPair(b, &quicgo.Config{})
		measurePings(b, rawPing(b, c, s, -1))
	})
	b.Run("ours", func(b *testing.B) {
		c, s := oursPair(b, Config{})
		measurePings(b, oursPing(b, c, s))
	})
}

func BenchmarkBulk(b *testing.B) {
	for _, n := range []int{1, 4} {
		run := func(b *testing.B, start func() *bulk) {
			bk := start()
			b.SetBytes(1 << 20)
			b.ResetTimer()
			t0 := time.Now()
			r0 := bk.received.Load()
			want := r0 + int64(b.N)<<20
			for bk.received.Load() < want {
				time.Sleep(200 * time.Microsecond) // polling the receivers' counter
			}
			el := time.Since(t0)
			b.StopTimer()
			b.ReportMetric(float64(bk.received.Load()-r0)/el.Seconds()/1e6, "MB/s")
			bk.halt()
		}
		b.Run(fmt.Sprintf("raw/streams=%d", n), func(b *testing.B) {
			c, s := rawPair(b, &quicgo.Config{})
			run(b, func() *bulk { return rawBulk(b, c, s, n) })
		})
		b.Run(fmt.Sprintf("rawourwindows/streams=%d", n), func(b *testing.B) {
			c, s := rawPair(b, window{"ours", DefaultStreamReceiveWindow, DefaultConnectionReceiveWindow}.quic())
			run(b, func() *bulk { return rawBulk(b, c, s, n) })
		})
		b.Run(fmt.Sprintf("ours/streams=%d", n), func(b *testing.B) {
			c, s := oursPair(b, Config{})
			run(b, func() *bulk { return oursBulk(b, c, s, n) })
		})
		b.Run(fmt.Sprintf("ours-hint/streams=%d", n), func(b *testing.B) {
			c, s := oursPairHint(b, Config{}, 0)
			run(b, func() *bulk { return oursBulk(b, c, s, n) })
		})
	}
}

// BenchmarkControlUnderBulk: 64-byte round trips on one stream while one
// bulk stream writes as fast as it can. Reports p50/p99 and the bulk
// throughput during the pings.
func BenchmarkControlUnderBulk(b *testing.B) {
	run := func(b *testing.B, ping *pingStream, bk *bulk) {
		// Let the bulk stream fill the pipe first.
		for i := 0; i < 1000 && bk.received.Load() < 4<<20; i++ {
			time.Sleep(time.Millisecond) // polling: no event marks "pipe full"
		}
		r0, t0 := bk.received.Load(), time.Now()
		measurePings(b, ping)
		el := time.Since(t0)
		b.ReportMetric(float64(bk.received.Load()-r0)/el.Seconds()/1e6, "bulk-MB/s")
		bk.halt()
	}
	for _, w := range benchWindows {
		b.Run("raw/win="+w.name, func(b *testing.B) {
			c, s := rawPair(b, w.quic())
			run(b, rawPing(b, c, s, -1), rawBulk(b, c, s, 1))
		})
		b.Run("raw-urgent/win="+w.name, func(b *testing.B) {
			c, s := rawPair(b, w.quic())
			run(b, rawPing(b, c, s, 0), rawBulk(b, c, s, 1))
		})
		b.Run("ours/win="+w.name, func(b *testing.B) {
			c, s := oursPair(b, w.ours())
			run(b, oursPing(b, c, s), oursBulk(b, c, s, 1))
		})
		b.Run("ours-hint/win="+w.name, func(b *testing.B) {
			c, s := oursPairHint(b, w.ours(), 0)
			run(b, oursPing(b, c, s), oursBulk(b, c, s, 1))
		})
	}
}

// BenchmarkWindowSweep compares receive-window settings for control RTT
// under one saturating bulk stream, interleaving the configurations round
// by round so that a shared machine's changing load hits all of them
// alike. Run with -benchtime=1x; FY_SWEEP_ROUNDS (default 5) rounds of
// 500 pings each. Results (medians over rounds) go to the log.
func BenchmarkWindowSweep(b *testing.B) {
	rounds := 5
	if v, err := strconv.Atoi(os.Getenv("FY_SWEEP_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	type result struct{ p50, p99, mbps []float64 }
	res := make(map[string]*result)
	var names []string
	one := func(name string, setup func(b *testing.B) (*pingStream, *bulk)) {
		r := res[name]
		if r == nil {
			r = &result{}
			res[name] = r
			names = append(names, name)
		}
		b.Run(name, func(b *testing.B) {
			ping, bk := setup(b)
			for i := 0; i < 1000 && bk.received.Load() < 4<<20; i++ {
				time.Sleep(time.Millisecond) // polling: no event marks "pipe full"
			}
			rtts := make([]time.Duration, 0, 500)
			r0, t0 := bk.received.Load(), time.Now()
			for range 500 {
				d, err := ping.rtt()
				if err != nil {
					b.Fatal(err)
				}
				rtts = append(rtts, d)
			}
			el := time.Since(t0)
			mb := float64(bk.received.Load()-r0) / el.Seconds() / 1e6
			bk.halt()
			slices.Sort(rtts)
			r.p50 = append(r.p50, float64(stats.Percentile(rtts, 50).Microseconds()))
			r.p99 = append(r.p99, float64(stats.Percentile(rtts, 99).Microseconds()))
			r.mbps = append(r.mbps, mb)
		})
	}
	windows := benchWindows
	if f := os.Getenv("FY_SWEEP_WINDOWS"); f != "" { // e.g. "default,64K-1M"
		windows = slices.DeleteFunc(slices.Clone(windows), func(w window) bool {
			return !slices.Contains(strings.Split(f, ","), w.name)
		})
	}
	for round := range rounds {
		for _, w := range windows {
			one(fmt.Sprintf("raw/win=%s/round=%d", w.name, round), func(b *testing.B) (*pingStream, *bulk) {
				c, s := rawPair(b, w.quic())
				return rawPing(b, c, s, -1), rawBulk(b, c, s, 1)
			})
			one(fmt.Sprintf("ours/win=%s/round=%d", w.name, round), func(b *testing.B) (*pingStream, *bulk) {
				c, s := oursPair(b, w.ours())
				return oursPing(b, c, s), oursBulk(b, c, s, 1)
			})
			one(fmt.Sprintf("ours-hint/win=%s/round=%d", w.name, round), func(b *testing.B) (*pingStream, *bulk) {
				c, s := oursPairHint(b, w.ours(), 0)
				return oursPing(b, c, s), oursBulk(b, c, s, 1)
			})
		}
	}
	med := func(v []float64) float64 {
		v = slices.Clone(v)
		slices.Sort(v)
		if len(v) == 0 {
			return 0
		}
		return v[len(v)/2]
	}
	agg := map[string]*result{}
	var order []string
	for _, n := range names {
		key := n[:strings.LastIndex(n, "/round=")]
		if agg[key] == nil {
			agg[key] = &result{}
			order = append(order, key)
		}
		a, r := agg[key], res[n]
		a.p50 = append(a.p50, r.p50...)
		a.p99 = append(a.p99, r.p99...)
		a.mbps = append(a.mbps, r.mbps...)
	}
	for _, k := range order {
		a := agg[k]
		b.Logf("%-24s bulk %6.0f MB/s  p50 %6.0f µs  p99 %6.0f µs  (p99 per round %v)", k, med(a.mbps), med(a.p50), med(a.p99), a.p99)
	}
}
