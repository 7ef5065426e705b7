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

// TestKeepAliveAdapts: the rule on its own. Three losses at about the
// same idle time below the interval halve it to below that time, logged
// once; irregular losses, a run broken by a long-lived connection, losses
// at or above the (new) interval, and adaptation turned off change
// nothing.
func TestKeepAliveAdapts(t *testing.T) {
	s := time.Second
	var logs syncBuffer
	k := NewKeepAlive(0, true, slog.New(slog.NewTextHandler(&logs, nil)))
	if k.Interval() != yamux.DefaultKeepAliveInterval {
		t.Fatalf("default interval %v", k.Interval())
	}
	k.observeLoss(5 * s)
	k.observeLoss(5200 * time.Millisecond)
	if k.Interval() != 10*s {
		t.Fatalf("adapted after two losses: %v", k.Interval())
	}
	k.observeLoss(4900 * time.Millisecond)
	if got := k.Interval(); got != 2500*time.Millisecond {
		t.Fatalf("after three losses at ~5s idle: interval %v, want 2.5s", got)
	}
	if n := strings.Count(logs.String(), "keepalive shortened"); n != 1 {
		t.Fatalf("%d log lines, want 1:\n%s", n, logs.String())
	}
	for _, want := range []string{"idle_cut=5s", "from=10s", "to=2.5s", "key=control_plane.keepalive_interval"} {
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

	irregular := NewKeepAlive(0, true, nil)
	for _, d := range []time.Duration{2 * s, 7 * s, 4 * s, 9 * s, 1 * s} {
		irregular.observeLoss(d)
	}
	if irregular.Interval() != 10*s {
		t.Fatalf("irregular losses adapted to %v", irregular.Interval())
	}
	// A connection that outlived the cuts by more than the interval breaks
	// the run; a short one (a losing race candidate, a probe) does not.
	broken := NewKeepAlive(0, true, nil)
	broken.observeLoss(5 * s)
	broken.observeLoss(5 * s)
	broken.observeEnd(time.Minute)
	broken.observeLoss(5 * s)
	if broken.Interval() != 10*s {
		t.Fatalf("a broken run adapted to %v", broken.Interval())
	}
	short := NewKeepAlive(0, true, nil)
	short.observeLoss(5 * s)
	short.observeLoss(5 * s)
	short.observeEnd(200 * time.Millisecond)
	short.observeLoss(5 * s)
	if short.Interval() != 2500*time.Millisecond {
		t.Fatalf("a short-lived connection broke the run: %v", short.Interval())
	}
	off := NewKeepAlive(8*s, false, nil)
	for range 5 {
		off.observeLoss(3 * s)
	}
	if off.Interval() != 8*s {
		t.Fatalf("adaptation off, yet %v", off.Interval())
	}
	floor := NewKeepAlive(0, true, nil)
	for range 3 {
		floor.observeLoss(1200 * time.Millisecond)
	}
	if floor.Interval() != MinKeepAlive {
		t.Fatalf("cut at 1.2s: interval %v, want the %v floor", floor.Interval(), MinKeepAlive)
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
// a forwarder that cuts them after 300 ms of silence. With a 2 s keepalive
// the first three are cut at about 300 ms idle; the dialer then pings every
// ~150 ms, and the fourth connection outlives four cuts' worth of time.
func TestKeepAliveDialerAdaptsToIdleCuts(t *testing.T) {
	const cut = 300 * time.Millisecond
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
	k.onAdapt = func(_, to, _ time.Duration) { adapted <- to }
	d := keepAliveDialer{d: yamux.Dialer{TLS: pki.ClientConfig(t, wire.NewRunnerId(), "localhost")}, ka: k}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range AdaptAfter {
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
	if n := cuts.Load(); n != AdaptAfter {
		t.Fatalf("%d cuts, want %d", n, AdaptAfter)
	}
	t.Logf("idle cut %v: keepalive 2s → %v", cut, to)
}
