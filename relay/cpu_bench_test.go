package relay_test

import (
	"context"
	"io"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/yamux/rawbench"
	"forgeyard.dev/transport/relay"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// BenchmarkRelayCPU measures what a relayed byte costs in CPU (issue 19
// item 4): agent —TLS+yamux→ relay —QUIC→ daemon, raw streams at both ends
// (no semantics layer), beside the relay's two legs alone in the same run:
//
//   - leg-yamux: raw hashicorp/yamux over TLS 1.3 (rawbench.StreamPair, the
//     same 16 MiB stream window as the backend),
//   - leg-quic: a direct QUIC connection, raw streams of backends/quic (a
//     thin adapter over quic-go streams; quic-go itself may only be imported
//     by the QUIC backends),
//   - leg-yamux-relaywin: leg-yamux with the relay's agent-facing window
//     (relay.DefaultAgentStreamWindow) instead of 16 MiB,
//   - raw-chain: the ideal relay on this machine, leg-yamux-relaywin into a
//     plain io.CopyBuffer (CopyBuffer bytes) into a raw QUIC leg: what any
//     relay must at least spend, and the fastest it can go, when all three
//     parties share the same CPUs.
//
// Every op moves relayCPUBytes agent → daemon over each of the paths in
// turn (256 KiB writes), so load from elsewhere on the machine hits all of
// them alike. Agent, relay and daemon live in this process: the figures
// are the process's user+system CPU seconds per GiB delivered, for the
// whole path (both ends of each leg). "ratio" is relay ÷ (leg-yamux +
// leg-quic): 1 means relaying costs exactly its two legs (the agent's
// TLS+yamux send and the relay's receive, the relay's QUIC send and the
// daemon's receive), so the excess is the relay's own work (copying,
// pacing, stream bookkeeping) plus the difference between our backends and
// the raw libraries at the ends; "ratio-relaywin" is the same with
// leg-yamux-relaywin, "ratio-chain" relay ÷ raw-chain. Per path it also reports the Go heap
// bytes allocated per byte delivered (alloc-B/B, runtime.MemStats) and the
// cores busy (CPU ÷ wall seconds: 2 on this 2-vCPU machine means the path
// is CPU-bound, so its rate is cores ÷ CPU per byte).
//
//	go test ./relay -run '^$' -bench 'BenchmarkRelayCPU$' -benchtime 4x -count 6
func BenchmarkRelayCPU(b *testing.B) {
	const relayCPUBytes = 128 << 20
	type path struct {
		name  string
		w     io.Writer
		r     io.Reader
		cpu   time.Duration
		wall  time.Duration
		alloc uint64 // bytes allocated on the Go heap (runtime.MemStats.TotalAlloc)
	}
	// Every goroutine of a path (set up under its label, or started per op
	// under it) carries pprof label path=<name>, so a CPU profile splits by
	// path: go tool pprof -tagfocus path=relay-yamux.
	label := func(name string) {
		pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels("path", name)))
	}
	defer pprof.SetGoroutineLabels(context.Background())
	var paths []*path
	for _, name := range []string{"relay-yamux", "direct-quic"} {
		label(strings.Replace(name, "direct-quic", "leg-quic", 1))
		a, d := benchPath(b, name)
		w, r := rawUniPair(b, a, d)
		if name == "direct-quic" {
			name = "leg-quic"
		}
		paths = append(paths, &path{name: name, w: w, r: r})
	}
	pki := trusttest.NewPKI(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	label("leg-yamux")
	yp, err := rawbench.StreamPair(ctx, pki.ServerConfig(b, serverName), pki.ClientConfig(b, wire.NewRunnerId(), serverName))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = yp.Close() })
	paths = append(paths, &path{name: "leg-yamux", w: yp.Client, r: yp.Server})
	// The same raw leg with the relay's agent-facing window, and the raw
	// chain: that leg, a plain copy loop, a raw QUIC leg.
	label("leg-yamux-relaywin")
	yw, err := rawbench.StreamPairWindow(ctx, pki.ServerConfig(b, serverName), pki.ClientConfig(b, wire.NewRunnerId(), serverName), relay.DefaultAgentStreamWindow)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = yw.Close() })
	paths = append(paths, &path{name: "leg-yamux-relaywin", w: yw.Client, r: yw.Server})
	label("raw-chain")
	yc, err := rawbench.StreamPairWindow(ctx, pki.ServerConfig(b, serverName), pki.ClientConfig(b, wire.NewRunnerId(), serverName), relay.DefaultAgentStreamWindow)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = yc.Close() })
	qa, qd := benchPath(b, "direct-quic")
	qw, qr := rawUniPair(b, qa, qd)
	go func() { _, _ = io.CopyBuffer(qw, yc.Server, make([]byte, relay.DefaultCopyBuffer)) }() // ends when yc closes
	paths = append(paths, &path{name: "raw-chain", w: yc.Client, r: qr})

	buf := make([]byte, 256<<10)
	var ms runtime.MemStats
	b.ResetTimer()
	for range b.N {
		for _, p := range paths {
			label(p.name)
			got := make(chan int64, 1)
			runtime.ReadMemStats(&ms)
			a0 := ms.TotalAlloc
			t0, c0 := time.Now(), cpuTime()
			go func() {
				n, _ := io.CopyN(io.Discard, p.r, relayCPUBytes)
				got <- n
			}()
			for sent := 0; sent < relayCPUBytes; sent += len(buf) {
				if _, err := p.w.Write(buf); err != nil {
					b.Fatalf("%s: write: %v", p.name, err)
				}
			}
			if n := <-got; n != relayCPUBytes {
				b.Fatalf("%s: daemon received %d of %d bytes", p.name, n, relayCPUBytes)
			}
			p.cpu += cpuTime() - c0
			p.wall += time.Since(t0)
			runtime.ReadMemStats(&ms)
			p.alloc += ms.TotalAlloc - a0
		}
	}
	b.StopTimer()
	gib := float64(b.N) * relayCPUBytes / (1 << 30)
	per := map[string]float64{}
	for _, p := range paths {
		per[p.name] = p.cpu.Seconds() / gib
		b.ReportMetric(per[p.name], p.name+"-cpu-s/GiB")
		b.ReportMetric(float64(b.N)*relayCPUBytes/p.wall.Seconds()/1e6, p.name+"-MB/s")
		b.ReportMetric(float64(p.alloc)/(float64(b.N)*relayCPUBytes), p.name+"-alloc-B/B")
		b.ReportMetric(p.cpu.Seconds()/p.wall.Seconds(), p.name+"-cores")
	}
	if legs := per["leg-yamux"] + per["leg-quic"]; legs > 0 {
		b.ReportMetric(per["relay-yamux"]/legs, "ratio")
	}
	if legs := per["leg-yamux-relaywin"] + per["leg-quic"]; legs > 0 {
		b.ReportMetric(per["relay-yamux"]/legs, "ratio-relaywin")
	}
	if per["raw-chain"] > 0 {
		b.ReportMetric(per["relay-yamux"]/per["raw-chain"], "ratio-chain")
	}
	b.ReportMetric(0, "ns/op")
}

// rawUniPair opens a CAS-upload stream from a and accepts it on d.
func rawUniPair(b *testing.B, a, d semantics.BackendConn) (io.Writer, io.Reader) {
	ctx := context.Background()
	as, err := a.OpenUniStream(ctx)
	if err != nil {
		b.Fatal(err)
	}
	hdr := header(wire.StreamCasUpload)
	if _, err := as.Write(hdr); err != nil {
		b.Fatal(err)
	}
	ds, err := d.AcceptUniStream(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.ReadFull(ds, make([]byte, len(hdr))); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { as.CancelWrite(semantics.StreamCancelled) })
	return as, ds
}

// BenchmarkRelayControlUnderBulkPaced: control round trips agent → daemon
// → agent through the relay over yamux while the daemon saturates a
// CAS-download stream towards the agent, both ends being semantics.Conns
// (so the daemon's bulk is paced by the semantics scheduler, as in the
// product, issue 19 item 4), beside the idle round trip of the same path
// in the same run (idle). Reports p50/p99 (µs) and the bulk rate during
// the pings.
//
//	go test ./relay -run '^$' -bench 'BenchmarkRelayControlUnderBulkPaced$' -benchtime 1000x -count 6
func BenchmarkRelayControlUnderBulkPaced(b *testing.B) {
	for _, mode := range []string{"idle", "bulk"} {
		b.Run(mode, func(b *testing.B) {
			ab, db := benchPath(b, "relay-yamux")
			a, err := semantics.NewConn(ab, semantics.Config{})
			if err != nil {
				b.Fatal(err)
			}
			d, err := semantics.NewConn(db, semantics.Config{})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			var received atomic.Int64
			var stop func()
			if mode == "bulk" {
				du, err := d.OpenUniStream(ctx, wire.StreamCasDownload)
				if err != nil {
					b.Fatal(err)
				}
				done := make(chan struct{})
				halted := make(chan struct{})
				go func() {
					defer close(halted)
					buf := make([]byte, 256<<10)
					for {
						select {
						case <-done:
							du.CancelWrite(semantics.StreamCancelled)
							return
						default:
						}
						if _, err := du.Write(buf); err != nil {
							return
						}
					}
				}()
				au, err := a.AcceptUniStream(ctx)
				if err != nil {
					b.Fatal(err)
				}
				go func() {
					buf := make([]byte, 64<<10)
					for {
						n, err := au.Read(buf)
						received.Add(int64(n))
						if err != nil {
							return
						}
					}
				}()
				stop = func() {
					close(done)
					<-halted
				}
			}
			as, err := a.OpenStream(ctx, wire.StreamControl)
			if err != nil {
				b.Fatal(err)
			}
			req, resp := make([]byte, 64), make([]byte, 64)
			if _, err := as.Write(req); err != nil {
				b.Fatal(err)
			}
			ds, err := d.AcceptStream(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(ds, resp); err != nil {
				b.Fatal(err)
			}
			go func() { _, _ = io.Copy(ds, ds) }() // the daemon echoes
			if mode == "bulk" {
				time.Sleep(100 * time.Millisecond) // the measurement's warm-up: let the bulk stream fill every queue
			}
			n := max(b.N, 200)
			rtts := make([]time.Duration, 0, n)
			t0, r0 := time.Now(), received.Load()
			b.ResetTimer()
			for range n {
				s := time.Now()
				if _, err := as.Write(req); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(as, resp); err != nil {
					b.Fatal(err)
				}
				rtts = append(rtts, time.Since(s))
			}
			b.StopTimer()
			el, r1 := time.Since(t0), received.Load()
			if stop != nil {
				stop()
				if r1 == r0 {
					b.Fatal("no bulk byte reached the agent during the pings")
				}
				b.ReportMetric(float64(r1-r0)/el.Seconds()/1e6, "bulk-MB/s")
			}
			slices.Sort(rtts)
			pct := func(p int) float64 { return float64(rtts[(len(rtts)-1)*p/100].Nanoseconds()) / 1e3 }
			b.ReportMetric(pct(50), "p50-µs")
			b.ReportMetric(pct(99), "p99-µs")
			b.ReportMetric(0, "ns/op")
			_ = a.CloseWithCode(wire.CloseNormal, "")
			_ = d.CloseWithCode(wire.CloseNormal, "")
		})
	}
}
