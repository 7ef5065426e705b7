package yamux

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// idleCutter forwards TCP to target and closes a connection once no byte
// moved either way for cut, like a proxy with an idle timeout (tinyproxy
// Timeout, squid read_timeout).
type idleCutter struct {
	ln   net.Listener
	cut  time.Duration
	wg   sync.WaitGroup
	cuts atomic.Int64
}

func startIdleCutter(t *testing.T, target string, cut time.Duration) *idleCutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &idleCutter{ln: ln, cut: cut}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
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
			p.wg.Add(1)
			go func() { defer p.wg.Done(); p.relay(c, up) }()
		}
	}()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *idleCutter) relay(a, b net.Conn) {
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				last.Store(time.Now().UnixNano())
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		done <- struct{}{}
	}
	go pipe(a, b)
	go pipe(b, a)
	tick := time.NewTicker(p.cut / 20)
	defer tick.Stop()
	for {
		select {
		case <-done:
			a.Close()
			b.Close()
			<-done
			return
		case <-tick.C:
			if time.Since(time.Unix(0, last.Load())) >= p.cut {
				p.cuts.Add(1)
				a.Close()
				b.Close()
				<-done
				<-done
				return
			}
		}
	}
}

// TestIdleAtLoss: a connection dropped by a box that cuts idle tunnels
// reports how long it had been idle (about the box's timeout); a
// connection closed with a close record reports nothing.
func TestIdleAtLoss(t *testing.T) {
	pki := trusttest.NewPKI(t)
	ln, err := Listen("127.0.0.1:0", pki.ServerConfig(t, "localhost"), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const cut = 400 * time.Millisecond
	p := startIdleCutter(t, ln.Addr().String(), cut)
	d := Dialer{TLS: pki.ClientConfig(t, wire.NewRunnerId(), "localhost"), Config: Config{KeepAliveInterval: 5 * time.Second}}
	bc, err := d.Dial(ctxT(t), p.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc, err := ln.Accept(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer sc.CloseWithCode(wire.CloseNormal, "")
	c := bc.(*Conn)
	if _, ok := c.IdleAtLoss(); ok {
		t.Fatal("IdleAtLoss on an open connection")
	}
	select {
	case <-c.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the idle cutter did not cut the connection")
	}
	idle, ok := c.IdleAtLoss()
	if !ok || idle < cut || idle > cut+cut/2 {
		t.Fatalf("IdleAtLoss = %v, %v; want about %v (cut by the box)", idle, ok, cut)
	}
	if p.cuts.Load() != 1 {
		t.Fatalf("%d cuts", p.cuts.Load())
	}

	// Pinging more often than the cut keeps the connection.
	d.Config.KeepAliveInterval = cut / 4
	bc, err = d.Dial(ctxT(t), p.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc2, err := ln.Accept(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc2.CloseWithCode(wire.CloseNormal, "") })
	c = bc.(*Conn)
	// Four times the cut: the pings' round trips are the only traffic.
	timer := time.NewTimer(4 * cut)
	select {
	case <-c.Context().Done():
		t.Fatalf("connection lost with keepalive %v below the %v cut: %v", cut/4, cut, c.Context().Err())
	case <-timer.C:
	}
	_ = c.CloseWithCode(wire.CloseNormal, "done")
	<-c.Context().Done()
	if _, ok := c.IdleAtLoss(); ok {
		t.Fatal("IdleAtLoss after a local close")
	}
}
