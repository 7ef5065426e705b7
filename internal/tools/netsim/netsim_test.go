package netsim

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// udpEcho echoes datagrams until closed.
func udpEcho(t *testing.T) string {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 65536)
		for {
			n, a, err := c.ReadFromUDP(buf)
			if err != nil {
				return
			}
			c.WriteToUDP(buf[:n], a)
		}
	}()
	t.Cleanup(func() { c.Close(); wg.Wait() })
	return c.LocalAddr().String()
}

func newUDPClient(t *testing.T, addr string) *net.UDPConn {
	t.Helper()
	ra, _ := net.ResolveUDPAddr("udp", addr)
	c, err := net.DialUDP("udp", nil, ra)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip sends msg and waits up to wait for the echo.
func roundTrip(c *net.UDPConn, msg []byte, wait time.Duration) (time.Duration, bool) {
	start := time.Now()
	c.Write(msg)
	c.SetReadDeadline(start.Add(wait))
	buf := make([]byte, 65536)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return 0, false
		}
		if bytes.Equal(buf[:n], msg) {
			return time.Since(start), true
		}
	}
}

func TestUDPLatency(t *testing.T) {
	p, err := NewUDPProxy(udpEcho(t), Options{Up: Impairment{Latency: 20 * time.Millisecond}, Down: Impairment{Latency: 15 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := newUDPClient(t, p.Addr())
	rtt, ok := roundTrip(c, []byte("ping"), 2*time.Second)
	if !ok {
		t.Fatal("no echo")
	}
	if rtt < 35*time.Millisecond {
		t.Errorf("rtt %v < 35ms of configured latency", rtt)
	}
	p.SetUp(Impairment{})
	p.SetDown(Impairment{})
	if rtt, ok := roundTrip(c, []byte("fast"), 2*time.Second); !ok || rtt >= 35*time.Millisecond {
		t.Errorf("after clearing latency rtt=%v ok=%v", rtt, ok)
	}
	// The proxy counts a datagram after its write returned, which can be
	// after the client read it: poll (no event exists) with a deadline.
	deadline := time.Now().Add(2 * time.Second)
	s := p.Stats()
	for (s.UpBytes != 8 || s.DownBytes != 8) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
		s = p.Stats()
	}
	if s.Flows != 1 || s.UpBytes != 8 || s.DownBytes != 8 {
		t.Errorf("stats %+v", s)
	}
}

func TestUDPLossSeeded(t *testing.T) {
	got := func() uint64 {
		p, err := NewUDPProxy(udpEcho(t), Options{Up: Impairment{Loss: 0.5}, Seed: 7})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		c := newUDPClient(t, p.Addr())
		for i := range 200 {
			c.Write([]byte{byte(i)})
		}
		// Await the decision for every datagram: dropped + delivered = 200.
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			s := p.Stats()
			if s.UpDropped+s.UpBytes == 200 {
				return s.UpDropped
			}
			time.Sleep(time.Millisecond)
		}
		t.Fatalf("stats never settled: %+v", p.Stats())
		return 0
	}
	a, b := got(), got()
	if a < 60 || a > 140 {
		t.Errorf("dropped %d of 200 at loss 0.5", a)
	}
	if a != b {
		t.Errorf("same seed dropped %d then %d", a, b)
	}
}

func TestUDPBlackholeCutRestore(t *testing.T) {
	p, err := NewUDPProxy(udpEcho(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := newUDPClient(t, p.Addr())
	if _, ok := roundTrip(c, []byte("a"), 2*time.Second); !ok {
		t.Fatal("no echo before blackhole")
	}
	p.Blackhole(true)
	if _, ok := roundTrip(c, []byte("b"), 100*time.Millisecond); ok {
		t.Fatal("echo through blackhole")
	}
	p.Blackhole(false)
	if _, ok := roundTrip(c, []byte("c"), 2*time.Second); !ok {
		t.Fatal("no echo after blackhole off")
	}
	if n := p.Cut(); n != 1 {
		t.Fatalf("Cut = %d flows, want 1", n)
	}
	if _, ok := roundTrip(c, []byte("d"), 100*time.Millisecond); ok {
		t.Fatal("cut flow still forwarded")
	}
	c2 := newUDPClient(t, p.Addr())
	if _, ok := roundTrip(c2, []byte("e"), 2*time.Second); !ok {
		t.Fatal("new flow blocked after cut")
	}
	p.Restore()
	if _, ok := roundTrip(c, []byte("f"), 2*time.Second); !ok {
		t.Fatal("old flow blocked after Restore")
	}
	if s := p.Stats(); s.Cuts != 1 || s.Flows != 3 || s.UpDropped < 2 {
		t.Errorf("stats %+v", s)
	}
}

func TestUDPBandwidth(t *testing.T) {
	p, err := NewUDPProxy(udpEcho(t), Options{Up: Impairment{Bandwidth: 100_000}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := newUDPClient(t, p.Addr())
	msg := make([]byte, 1000)
	start := time.Now()
	for i := range 10 {
		msg[0] = byte(i)
		c.Write(msg)
	}
	c.SetReadDeadline(start.Add(3 * time.Second))
	buf := make([]byte, 2000)
	for range 10 {
		if _, err := c.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	if el := time.Since(start); el < 90*time.Millisecond {
		t.Errorf("10 kB at 100 kB/s took %v, want ≥ 100ms", el)
	}
}

func TestUDPMaxFlows(t *testing.T) {
	p, err := NewUDPProxy(udpEcho(t), Options{MaxFlows: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, ok := roundTrip(newUDPClient(t, p.Addr()), []byte("a"), 2*time.Second); !ok {
		t.Fatal("first flow")
	}
	if _, ok := roundTrip(newUDPClient(t, p.Addr()), []byte("b"), 100*time.Millisecond); ok {
		t.Fatal("second flow over MaxFlows=1 forwarded")
	}
	if p.Stats().Refused == 0 || p.Flows() != 1 {
		t.Errorf("stats %+v flows %d", p.Stats(), p.Flows())
	}
}

// tcpEcho echoes each connection until EOF, then closes it.
func tcpEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func dialTCP(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

func echoTCP(c net.Conn, msg []byte, wait time.Duration) (time.Duration, error) {
	start := time.Now()
	if _, err := c.Write(msg); err != nil {
		return 0, err
	}
	c.SetReadDeadline(start.Add(wait))
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return 0, err
	}
	if !bytes.Equal(buf, msg) {
		return 0, errors.New("echo mismatch")
	}
	return time.Since(start), nil
}

func TestTCPLatencyAndHalfClose(t *testing.T) {
	p, err := NewTCPProxy(tcpEcho(t), Options{Up: Impairment{Latency: 20 * time.Millisecond}, Down: Impairment{Latency: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := dialTCP(t, p.Addr())
	rtt, err := echoTCP(c, []byte("hello"), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if rtt < 40*time.Millisecond {
		t.Errorf("rtt %v < 40ms", rtt)
	}
	c.CloseWrite()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Errorf("after half-close read = %d, %v; want EOF", n, err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for p.Flows() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if p.Flows() != 0 {
		t.Error("finished connection not forgotten")
	}
}

func TestTCPCutBlackhole(t *testing.T) {
	p, err := NewTCPProxy(tcpEcho(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := dialTCP(t, p.Addr())
	if _, err := echoTCP(c, []byte("x"), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Blackhole(true)
	if _, err := echoTCP(c, []byte("y"), 100*time.Millisecond); err == nil {
		t.Fatal("echo through blackhole")
	}
	p.Blackhole(false)
	// The stalled "y" arrives once the path is back.
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 1)
	if _, err := io.ReadFull(c, buf); err != nil || buf[0] != 'y' {
		t.Fatalf("stalled byte after blackhole: %q %v", buf, err)
	}
	if n := p.Cut(); n != 1 {
		t.Fatalf("Cut = %d", n)
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(buf); err == nil {
		t.Fatal("read after cut succeeded")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("cut not noticed by the client before its deadline")
	}
	c2 := dialTCP(t, p.Addr())
	if _, err := echoTCP(c2, []byte("z"), 2*time.Second); err != nil {
		t.Fatalf("new connection after cut: %v", err)
	}
	if s := p.Stats(); s.Cuts != 1 || s.Flows != 2 {
		t.Errorf("stats %+v", s)
	}
}

func TestTCPBandwidth(t *testing.T) {
	p, err := NewTCPProxy(tcpEcho(t), Options{Down: Impairment{Bandwidth: 640_000}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := dialTCP(t, p.Addr())
	msg := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	el, err := echoTCP(c, msg, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if el < 90*time.Millisecond {
		t.Errorf("64 KiB at 640 kB/s took %v, want ≥ 100ms", el)
	}
}

func TestCloseWithLiveFlows(t *testing.T) {
	up, err := NewUDPProxy(udpEcho(t), Options{Up: Impairment{Latency: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	c := newUDPClient(t, up.Addr())
	c.Write([]byte("stuck in the delay line"))
	tp, err := NewTCPProxy(tcpEcho(t), Options{Down: Impairment{Latency: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	tc := dialTCP(t, tp.Addr())
	tc.Write([]byte("stuck"))
	tp.Blackhole(true)
	deadline := time.Now().Add(2 * time.Second)
	for (up.Flows() == 0 || tp.Flows() == 0) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	up.Close()
	tp.Close()
	up.Close() // idempotent
	tp.Close()
	if el := time.Since(start); el > time.Second {
		t.Errorf("Close took %v", el)
	}
	// goleak in TestMain checks that nothing is left running.
}

// TestUDPQueueDropTail: datagrams that would wait longer than Queue for
// the serializer are dropped; those within it are delivered.
func TestUDPQueueDropTail(t *testing.T) {
	// 500 B at 100 kB/s = 5 ms each; a 10 ms queue holds about two.
	p, err := NewUDPProxy(udpEcho(t), Options{Up: Impairment{Bandwidth: 100_000, Queue: 10 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := newUDPClient(t, p.Addr())
	msg := make([]byte, 500)
	for i := range 20 {
		msg[0] = byte(i)
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
	}
	got := 0
	buf := make([]byte, 2048)
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	for {
		if _, err := c.Read(buf); err != nil {
			break
		}
		got++
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	}
	s := p.Stats()
	if got == 0 || s.UpDropped < 5 || uint64(got)+s.UpDropped != 20 {
		t.Errorf("echoed %d, dropped %d of 20; want some of each, summing to 20", got, s.UpDropped)
	}
}

// TestUDPJitterKeepsOrder: jitter delays datagrams but never reorders them.
func TestUDPJitterKeepsOrder(t *testing.T) {
	p, err := NewUDPProxy(udpEcho(t), Options{Up: Impairment{Latency: time.Millisecond, Jitter: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := newUDPClient(t, p.Addr())
	const n = 50
	start := time.Now()
	for i := range n {
		if _, err := c.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 16)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i := range n {
		m, err := c.Read(buf)
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		if m != 1 || buf[0] != byte(i) {
			t.Fatalf("datagram %d arrived as %v", i, buf[:m])
		}
	}
	if el := time.Since(start); el < time.Millisecond {
		t.Errorf("50 datagrams with 1 ms latency echoed in %v", el)
	}
}

// TestTCPLossStall: a lost segment holds its chunk for LossStall.
func TestTCPLossStall(t *testing.T) {
	p, err := NewTCPProxy(tcpEcho(t), Options{Up: Impairment{Loss: 1, LossStall: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := dialTCP(t, p.Addr())
	rtt, err := echoTCP(c, []byte("hello"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if rtt < 100*time.Millisecond {
		t.Errorf("rtt %v with every segment lost, want ≥ the 100 ms stall", rtt)
	}
}

// TestTCPQueueBackpressure: with Queue set the proxy stops reading instead
// of queueing more than the bound for the serializer, and nothing is lost.
func TestTCPQueueBackpressure(t *testing.T) {
	const bw, queue = 2_000_000, 10 * time.Millisecond
	p, err := NewTCPProxy(tcpEcho(t), Options{Up: Impairment{Bandwidth: bw, Queue: queue}, TCPReadBuffer: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := dialTCP(t, p.Addr())
	msg := bytes.Repeat([]byte("0123456789abcdef"), 32768) // 512 KiB
	var peak time.Duration
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() { // samples the serializer backlog while the echo runs
		defer close(sampled)
		tk := time.NewTicker(500 * time.Microsecond)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case <-tk.C:
				if w, _ := p.up.backlog(time.Now()); w > peak {
					peak = w
				}
			}
		}
	}()
	_, err = echoTCP(c, msg, 10*time.Second)
	close(done)
	<-sampled
	if err != nil {
		t.Fatal(err)
	}
	// One chunk (16 KiB = 8.2 ms at 2 MB/s) may be admitted at the bound.
	if limit := queue + tcpChunk*time.Second/bw; peak > limit {
		t.Errorf("serializer backlog peaked at %v, want ≤ %v", peak, limit)
	}
	if peak == 0 {
		t.Error("the backlog was never observed: the bandwidth limit did not apply")
	}
}
