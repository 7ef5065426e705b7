package agentsetup

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// syncBuffer is a log sink safe for the keepalive's callbacks.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestKeepAliveAdapts: the rule on its own. One loss after ≥ 2 s idle
// below the interval halves it at once, logged once; losses at shorter idle
// times need three in a row at about the same time; irregular ones, a run
// broken by a long-lived connection, losses at or above the (new) interval,
// and adaptation turned off change nothing.
func TestKeepAliveAdapts(t *testing.T) {
	s := time.Second
	var logs syncBuffer
	k := NewKeepAlive(0, true, slog.New(slog.NewTextHandler(&logs, nil)))
	if k.Interval() != yamux.DefaultKeepAliveInterval {
		t.Fatalf("default interval %v", k.Interval())
	}
	k.observeLoss(5 * s)
	if got := k.Interval(); got != 2500*time.Millisecond {
		t.Fatalf("after one loss at 5s idle: interval %v, want 2.5s", got)
	}
	if n := strings.Count(logs.String(), "keepalive shortened"); n != 1 {
		t.Fatalf("%d log lines, want 1:\n%s", n, logs.String())
	}
	for _, want := range []string{"idle_cut=5s", "from=10s", "to=2.5s", "key=control_plane.keepalive_interval", "losses=1", "retry_configured_after=30m0s"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log line lacks %q:\n%s", want, logs.String())
		}
	}
	// Losses at 5 s are no longer idle cuts: the pings run every 2.5 s.
	for range 4 {
		k.observeLoss(5 * s)
	}
	if k.Interval() != 2500*time.Millisecond || strings.Count(logs.String(), "keepalive shortened") != 1 {
		t.Fatalf("changed again: %v\n%s", k.Interval(), logs.String())
	}

	short := NewKeepAlive(0, true, nil)
	short.observeLoss(1500 * time.Millisecond)
	short.observeLoss(1500 * time.Millisecond)
	if short.Interval() != 10*s {
		t.Fatalf("adapted after two short losses: %v", short.Interval())
	}
	short.observeEnd(200 * time.Millisecond) // a losing race candidate: says nothing
	short.observeLoss(1600 * time.Millisecond)
	if short.Interval() != MinKeepAlive {
		t.Fatalf("three losses at ~1.5s: interval %v, want the %v floor", short.Interval(), MinKeepAlive)
	}
	irregular := NewKeepAlive(0, true, nil)
	for _, d := range []time.Duration{1900 * time.Millisecond, 300 * time.Millisecond, 1200 * time.Millisecond, 600 * time.Millisecond} {
		irregular.observeLoss(d)
	}
	if irregular.Interval() != 10*s {
		t.Fatalf("irregular losses adapted to %v", irregular.Interval())
	}
	// A connection that outlived the short cuts by more than the interval
	// breaks the run.
	broken := NewKeepAlive(0, true, nil)
	broken.observeLoss(1500 * time.Millisecond)
	broken.observeLoss(1500 * time.Millisecond)
	broken.observeEnd(time.Minute)
	broken.observeLoss(1500 * time.Millisecond)
	if broken.Interval() != 10*s {
		t.Fatalf("a broken run adapted to %v", broken.Interval())
	}
	above := NewKeepAlive(4*s, true, nil)
	above.observeLoss(6 * s) // quieter than the pings: not an idle cut
	if above.Interval() != 4*s {
		t.Fatalf("a loss above the interval adapted to %v", above.Interval())
	}
	off := NewKeepAlive(8*s, false, nil)
	for range 5 {
		off.observeLoss(3 * s)
	}
	if off.Interval() != 8*s {
		t.Fatalf("adaptation off, yet %v", off.Interval())
	}
}

// TestKeepAliveRelaxes: a shortened interval goes back to the configured
// one after its hold; a cut soon after that shortens it again and doubles
// the hold; a cut long after starts from the first hold again.
func TestKeepAliveRelaxes(t *testing.T) {
	var logs syncBuffer
	k := NewKeepAlive(0, true, slog.New(slog.NewTextHandler(&logs, nil)))
	k.relaxAfter, k.hold = 40*time.Millisecond, 40*time.Millisecond
	relaxed := make(chan struct{}, 4)
	k.onRelax = func() { relaxed <- struct{}{} }
	waitRelax := func() {
		t.Helper()
		select {
		case <-relaxed:
		case <-time.After(10 * time.Second):
			t.Fatalf("never relaxed: interval %v", k.Interval())
		}
		if k.Interval() != 10*time.Second {
			t.Fatalf("relaxed to %v, want the configured 10s", k.Interval())
		}
	}
	k.observeLoss(5 * time.Second)
	if k.Interval() != 2500*time.Millisecond {
		t.Fatalf("interval %v", k.Interval())
	}
	waitRelax()
	k.observeLoss(5 * time.Second) // the network still cuts
	if !strings.Contains(logs.String(), "retry_configured_after=80ms") {
		t.Fatalf("hold not doubled:\n%s", logs.String())
	}
	waitRelax()
	if n := strings.Count(logs.String(), "keepalive back to the configured interval"); n != 2 {
		t.Fatalf("%d relax lines, want 2:\n%s", n, logs.String())
	}
}

// idleCutter forwards TCP and closes a connection after cut without
// traffic either way (a proxy's idle timeout).
func idleCutter(t *testing.T, target string, cut time.Duration) (addr string, cuts *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cuts = new(atomic.Int64)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				var last atomic.Int64
				last.Store(time.Now().UnixNano())
				done := make(chan struct{}, 2)
				pipe := func(dst, src net.Conn) {
					buf := make([]byte, 32<<10)
					for {
						n, err := src.Read(buf)
						if n > 0 {
							last.Store(time.Now().UnixNano())
							if _, err := dst.Write(buf[:n]); err != nil {
								break
							}
						}
						if err != nil {
							break
						}
					}
					done <- struct{}{}
				}
				go pipe(c, up)
				go pipe(up, c)
				tick := time.NewTicker(cut / 20)
				defer tick.Stop()
				for {
					select {
					case <-done:
						c.Close()
						up.Close()
						<-done
						return
					case <-tick.C:
						if time.Since(time.Unix(0, last.Load())) >= cut {
							cuts.Add(1)
							c.Close()
							up.Close()
							<-done
							<-done
							return
						}
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().String(), cuts
}

// TestKeepAliveDialerAdaptsToIdleCuts: real TLS+yamux connections through
// a forwarder that cuts them after 800 ms of silence (the test lowers the
// single-loss bound and the floor to fit). With a 2 s keepalive the first
// connection is cut at about 800 ms idle; the dialer then pings every
// ~400 ms, and the second connection outlives four cuts' worth of time.
// (With a 300 ms cut, a 150 ms scheduling stall of a loaded machine
// between two pings was enough for a second cut: 1 run in ~10 under load.)
func TestKeepAliveDialerAdaptsToIdleCuts(t *testing.T) {
	const cut = 800 * time.Millisecond
	pki := trusttest.NewPKI(t)
	ln, err := yamux.Listen("127.0.0.1:0", pki.ServerConfig(t, "localhost"), yamux.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr, cuts := idleCutter(t, ln.Addr().String(), cut)
	adapted := make(chan time.Duration, 1)
	k := NewKeepAlive(2*time.Second, true, nil)
	k.floor = 50 * time.Millisecond
	k.singleLoss = 200 * time.Millisecond
	k.onAdapt = func(_, to, _ time.Duration) { adapted <- to }
	d := keepAliveDialer{d: yamux.Dialer{TLS: pki.ClientConfig(t, wire.NewRunnerId(), "localhost")}, ka: k}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A live connection on an uncut path follows the change too.
	direct, err := d.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer direct.CloseWithCode(wire.CloseNormal, "")
	directSrv, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer directSrv.CloseWithCode(wire.CloseNormal, "")
	for i := range 1 {
		c, err := d.Dial(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		sc, err := ln.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-c.Context().Done():
		case <-ctx.Done():
			t.Fatalf("connection %d not cut", i)
		}
		_ = sc.CloseWithCode(wire.CloseNormal, "")
	}
	var to time.Duration
	select {
	case to = <-adapted:
	case <-ctx.Done():
		t.Fatalf("no adaptation after %d cuts (interval %v)", cuts.Load(), k.Interval())
	}
	if to >= cut || to < cut/4 {
		t.Fatalf("adapted to %v, want below the %v cut", to, cut)
	}
	if got := direct.(*yamux.Conn).KeepAliveInterval(); got != to {
		t.Fatalf("the live connection still pings every %v, want %v", got, to)
	}
	c, err := d.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.CloseWithCode(wire.CloseNormal, "")
	window := time.NewTimer(4 * cut)
	select {
	case <-c.Context().Done():
		t.Fatalf("cut again with keepalive %v: %v", to, context.Cause(c.Context()))
	case <-window.C:
	}
	_ = c.CloseWithCode(wire.CloseNormal, "done")
	if n := cuts.Load(); n != 1 {
		t.Fatalf("%d cuts, want 1", n)
	}
	t.Logf("idle cut %v: keepalive 2s → %v", cut, to)
}
