package quic

import (
	"context"
	"io"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/tools/netsim"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// TestWindowFitsPath: the connection's receive window grows with the
// path's bandwidth-delay product (Config.WindowRate), not with the queue.
// The growth is observed through a MemoryBudget, which every grant is
// charged to: none on loopback, where the minimum RTT is microseconds
// however long the queue makes the smoothed RTT, and some through a path
// of 30 ms RTT, where 256 KiB per round trip is the limit. The rate is
// 25 MB/s rather than the default 1 Gbit/s so that a loaded machine's
// loopback (a CI run measured a minimum RTT of a few milliseconds early in
// a connection, enough for one doubling at 1 Gbit/s) cannot pass for a
// long path: growing past 512 KiB then needs a minimum RTT of 15 ms.
func TestWindowFitsPath(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration // one way; 0: straight to the listener
		grow  bool
	}{
		{"loopback", 0, false},
		{"30ms RTT", 15 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			budget := NewMemoryBudget(64 << 20)
			cfg := Config{HandshakeTimeout: 5 * time.Second, WindowRate: 25_000_000}
			scfg := cfg
			scfg.Budget = budget // the receiving side's grants
			e := newTenv(t, scfg)
			addr := e.ln.Addr().String()
			if tc.delay > 0 {
				p, err := netsim.NewUDPProxy(addr, netsim.Options{
					Up:   netsim.Impairment{Latency: tc.delay},
					Down: netsim.Impairment{Latency: tc.delay},
				})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = p.Close() })
				addr = p.Addr()
			}
			c, s := dialAddr(t, e, cfg, addr)
			const total = 16 << 20
			got := sendUni(t, c, s, total)
			if got != total {
				t.Fatalf("received %d bytes, want %d", got, total)
			}
			used := budget.Used()
			t.Logf("%s: connection window grown by %d bytes", tc.name, used)
			if tc.grow && used == 0 {
				t.Fatal("the connection window did not grow on a 30 ms path")
			}
			if !tc.grow && used != 0 {
				t.Fatalf("the connection window grew by %d bytes on loopback", used)
			}
		})
	}
}

// dialAddr dials addr (the listener or a proxy in front of it) and
// accepts the connection on e's listener.
func dialAddr(t *testing.T, e *tenv, cfg Config, addr string) (client, server semantics.BackendConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		c   semantics.BackendConn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := e.ln.Accept(ctx); ch <- res{c, err} }()
	c, err := Dialer{TLS: e.pki.ClientConfig(t, wire.NewRunnerId(), serverName), Config: cfg}.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() {
		_ = c.CloseWithCode(wire.CloseNormal, "")
		_ = r.c.CloseWithCode(wire.CloseNormal, "")
	})
	return c, r.c
}

// sendUni writes total bytes on a new unidirectional stream from c and
// returns how many s read.
func sendUni(t *testing.T, c, s semantics.BackendConn, total int) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := c.OpenUniStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan int64, 1)
	go func() {
		rs, err := s.AcceptUniStream(ctx)
		if err != nil {
			done <- -1
			return
		}
		n, _ := io.Copy(io.Discard, rs)
		done <- n
	}()
	chunk := make([]byte, 64<<10)
	for i := 0; i < total/len(chunk); i++ {
		if _, err := st.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	_ = st.Close()
	return <-done
}
