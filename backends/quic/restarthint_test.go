package quic

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics"
)

// A dialled connection hears a restart hint from its peer's socket, and
// only from it: a hint from another address and a non-QUIC packet that is
// not a hint are ignored (they were sent first, on loopback, so they were
// read before the real one).
func TestRestartHintHeard(t *testing.T) {
	e := newTenv(t, testConfig)
	other := newTenv(t, testConfig)
	c, _ := e.dial(t, testConfig)
	qc := c.(*conn)
	ph, ok := c.(semantics.PeerHinter)
	if !ok || ph.PeerHints() == nil {
		t.Fatal("a dialled QUIC connection is not a semantics.PeerHinter with a channel")
	}
	to := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), qc.qc.LocalAddr().(*net.UDPAddr).AddrPort().Port())
	ctx := context.Background()
	if n, err := SendRestartHints(ctx, other.ln.ep.tr, []netip.AddrPort{to}, 0); err != nil || n != 1 {
		t.Fatalf("hint from another socket: sent %d, %v", n, err)
	}
	if _, err := e.ln.ep.tr.WriteTo([]byte{0x00, 'n', 'o', 'p', 'e', 0x01}, net.UDPAddrFromAddrPort(to)); err != nil {
		t.Fatal(err)
	}
	if n, err := e.ln.HintRestart(ctx, []netip.AddrPort{{}, to}, 0); err != nil || n != 1 {
		t.Fatalf("HintRestart sent %d, %v; want 1 (the invalid address skipped)", n, err)
	}
	select {
	case <-ph.PeerHints():
	case <-time.After(10 * time.Second):
		t.Fatal("no restart hint heard from the peer's socket")
	}
	if h := qc.heard.Load(); h != 1 {
		t.Fatalf("%d hints delivered, want 1 (only the peer's own)", h)
	}
	// The connection is untouched: a hint never ends it by itself.
	if err := context.Cause(qc.ctx); err != nil {
		t.Fatalf("connection ended after a hint: %v", err)
	}
	// An accepted connection has no hints.
	_, s := e.dial(t, testConfig)
	if s.(semantics.PeerHinter).PeerHints() != nil {
		t.Fatal("an accepted connection has a hint channel")
	}
}

// SendRestartHints paces: n hints at r per second take about n/r.
func TestSendRestartHintsPaced(t *testing.T) {
	e := newTenv(t, testConfig)
	sink, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	to := sink.LocalAddr().(*net.UDPAddr).AddrPort()
	peers := make([]netip.AddrPort, 300)
	for i := range peers {
		peers[i] = to
	}
	start := time.Now()
	n, err := e.ln.HintRestart(context.Background(), peers, 1000) // one per millisecond tick
	if err != nil || n != len(peers) {
		t.Fatalf("sent %d, %v; want %d", n, err, len(peers))
	}
	if el := time.Since(start); el < 250*time.Millisecond {
		t.Fatalf("300 hints at 1000/s took %v, want ≈ 300 ms", el)
	}
	buf := make([]byte, 64)
	_ = sink.SetReadDeadline(time.Now().Add(5 * time.Second))
	m, _, err := sink.ReadFromUDP(buf)
	if err != nil || !IsRestartHint(buf[:m]) {
		t.Fatalf("sink read %x, %v; want a restart hint", buf[:m], err)
	}
	// A canceled context stops it.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if n, err := e.ln.HintRestart(ctx, peers, 1000); err == nil || n >= len(peers) {
		t.Fatalf("canceled: sent %d, %v", n, err)
	}
}
