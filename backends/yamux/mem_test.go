package yamux

import (
	"bufio"
	"context"
	"crypto/tls"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	hyamux "github.com/hashicorp/yamux"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// TestIdleConnMemory measures the memory of idle connections: Go heap
// after GC and process RSS, per connection side, for raw hashicorp/yamux
// over TLS, this backend, and semantics.Conn over it. Both sides live in
// this process, so the figures are (client+server)/2. It is a measurement,
// not a check, and runs only when FY_MEM_CONNS is set, e.g.
//
//	FY_MEM_CONNS=1000 go test -run TestIdleConnMemory -v ./backends/yamux
func TestIdleConnMemory(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("FY_MEM_CONNS"))
	if n <= 0 {
		t.Skip("measurement only: set FY_MEM_CONNS=1000 to run")
	}
	measure := func(name string, open func()) {
		var ms0 runtime.MemStats
		h0, r0 := heapAndRSS()
		runtime.ReadMemStats(&ms0)
		start := time.Now()
		for range n {
			open()
		}
		time.Sleep(200 * time.Millisecond) // let handshake goroutines settle
		h1, r1 := heapAndRSS()
		if path := os.Getenv("FY_MEM_PROFILE"); path != "" {
			if f, err := os.Create(path + "." + name); err == nil {
				_ = pprof.WriteHeapProfile(f)
				_ = f.Close()
			}
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		per := func(d uint64) float64 { return float64(d) / float64(2*n) / 1024 }
		t.Logf("%-8s n=%d per side: heap=%.1f KiB stacks=%.1f KiB rss=%.1f KiB; goroutines=%d (setup %v)",
			name, n, per(h1-h0), per(ms.StackInuse-ms0.StackInuse), per(r1-r0),
			runtime.NumGoroutine(), time.Since(start).Round(time.Millisecond))
	}
	pki := trusttest.NewPKI(t)
	sconf := pki.ServerConfig(t, benchServerName)
	cconf := pki.ClientConfig(t, wire.NewRunnerId(), benchServerName)
	t.Run("raw", func(t *testing.T) {
		ycfg := rawYamuxConfig()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		var sessions []*hyamux.Session
		defer func() {
			for _, s := range sessions {
				_ = s.Close()
			}
		}()
		sc, cc := tlsConfig(sconf), tlsConfig(cconf)
		measure("raw", func() {
			ch := make(chan *hyamux.Session, 1)
			go func() {
				nc, err := ln.Accept()
				if err != nil {
					ch <- nil
					return
				}
				tc := tls.Server(nc, sc)
				if tc.Handshake() != nil {
					ch <- nil
					return
				}
				s, _ := hyamux.Server(tc, ycfg)
				ch <- s
			}()
			tc, err := tls.Dial("tcp", ln.Addr().String(), cc)
			if err != nil {
				t.Fatal(err)
			}
			c, _ := hyamux.Client(tc, ycfg)
			s := <-ch
			if s == nil {
				t.Fatal("raw accept failed")
			}
			sessions = append(sessions, c, s)
		})
	})
	for _, mode := range []string{"backend", "ours"} {
		t.Run(mode, func(t *testing.T) {
			ln, err := Listen("127.0.0.1:0", sconf, Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			var closers []func()
			defer func() {
				for _, f := range closers {
					f()
				}
			}()
			ctx := context.Background()
			measure(mode, func() {
				bc, err := Dialer{TLS: cconf}.Dial(ctx, ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				bs, err := ln.Accept(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if mode == "backend" {
					closers = append(closers, func() {
						_ = bc.CloseWithCode(wire.CloseNormal, "")
						_ = bs.CloseWithCode(wire.CloseNormal, "")
					})
					return
				}
				c, err1 := semantics.NewConn(bc, semantics.Config{})
				s, err2 := semantics.NewConn(bs, semantics.Config{})
				if err1 != nil || err2 != nil {
					t.Fatal(err1, err2)
				}
				closers = append(closers, func() {
					_ = c.CloseWithCode(wire.CloseNormal, "")
					_ = s.CloseWithCode(wire.CloseNormal, "")
				})
			})
		})
	}
}

// heapAndRSS returns HeapAlloc after two GCs and VmRSS, in bytes.
func heapAndRSS() (heap, rss uint64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	f, err := os.Open("/proc/self/status")
	if err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
				kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				rss = kb << 10
			}
		}
	}
	return ms.HeapAlloc, rss
}
