package quic

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
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
	if h := qc.hints.probes.Load(); h != 1 {
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

// hintSink is a loopback UDP socket to send hints to, closed at cleanup.
func hintSink(t *testing.T) (*net.UDPConn, netip.AddrPort) {
	t.Helper()
	sink, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sink.Close() })
	return sink, sink.LocalAddr().(*net.UDPAddr).AddrPort()
}

// readHint is the next datagram sink receives (within 5 s).
func readHint(t *testing.T, sink *net.UDPConn) []byte {
	t.Helper()
	buf := make([]byte, 64)
	_ = sink.SetReadDeadline(time.Now().Add(5 * time.Second))
	m, _, err := sink.ReadFromUDP(buf)
	if err != nil {
		t.Fatalf("sink read: %v", err)
	}
	return buf[:m]
}

// SendRestartHints paces: n hints at r per second take about n/r.
func TestSendRestartHintsPaced(t *testing.T) {
	e := newTenv(t, testConfig)
	sink, to := hintSink(t)
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
	if p := readHint(t, sink); !IsRestartHint(p) {
		t.Fatalf("sink read %x; want a restart hint", p)
	}
	// A canceled context stops it.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if n, err := e.ln.HintRestart(ctx, peers, 1000); err == nil || n >= len(peers) {
		t.Fatalf("canceled: sent %d, %v", n, err)
	}
}

// TestSendRestartHintsTokenFirst: the hints carrying a token go before the
// tokenless ones (listed first here), at TokenHintBoost times the rate:
// 200 tokenless and 200 token hints at 1,000/s take at least the
// tokenless ones' 200 ms, and the first hint the peer reads carries a token.
func TestSendRestartHintsTokenFirst(t *testing.T) {
	e := newTenv(t, testConfig)
	sink, to := hintSink(t)
	tok := semantics.RestartToken{KeyID: [4]byte{1}, Token: [16]byte{2}}
	var hints []RestartHint
	for range 200 {
		hints = append(hints, RestartHint{To: to})
	}
	for range 200 {
		hints = append(hints, RestartHint{To: to, Token: tok})
	}
	start := time.Now()
	n, err := e.ln.HintRestartTo(context.Background(), hints, 1000)
	if err != nil || n != len(hints) {
		t.Fatalf("sent %d, %v; want %d", n, err, len(hints))
	}
	if el := time.Since(start); el < 150*time.Millisecond {
		t.Fatalf("200 tokenless hints at 1000/s (after 200 at 4000/s) took %v, want ≥ 200 ms", el)
	}
	p := readHint(t, sink)
	if got, ok := ParseRestartHint(p); !ok || got != tok {
		t.Fatalf("first hint read %x: want the token hint first", p)
	}
}

// The datagram: the 6-byte tokenless hint (format 1, what daemons before
// restart tokens send) and the 26-byte hint with a token both parse;
// longer packets (later fields) keep their token; a packet cut inside the
// token is a tokenless hint; other non-QUIC packets are not hints.
func TestParseRestartHint(t *testing.T) {
	tok := semantics.RestartToken{KeyID: [4]byte{1, 2, 3, 4}, Token: [16]byte{5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}}
	with := AppendRestartHint(nil, tok)
	if len(with) != 26 || !bytes.Equal(with[:6], []byte{0x00, 'F', 'Y', 'R', 'H', 0x01}) {
		t.Fatalf("hint with a token = %x, want 26 bytes under the format-1 header", with)
	}
	if old := AppendRestartHint(nil, semantics.RestartToken{}); !bytes.Equal(old, restartHint) {
		t.Fatalf("tokenless hint = %x, want %x", old, restartHint)
	}
	for _, c := range []struct {
		name string
		p    []byte
		ok   bool
		tok  semantics.RestartToken
	}{
		{"format 1", []byte{0x00, 'F', 'Y', 'R', 'H', 0x01}, true, semantics.RestartToken{}},
		{"token", with, true, tok},
		{"token and later fields", append(append([]byte(nil), with...), 0xee, 0xee), true, tok},
		{"cut token", with[:20], true, semantics.RestartToken{}},
		{"other version", []byte{0x00, 'F', 'Y', 'R', 'H', 0x02}, false, semantics.RestartToken{}},
		{"not a hint", []byte{0x00, 'n', 'o', 'p', 'e', 0x01}, false, semantics.RestartToken{}},
	} {
		got, ok := ParseRestartHint(c.p)
		if ok != c.ok || got != c.tok {
			t.Errorf("%s: ParseRestartHint(%x) = %x, %v; want %x, %v", c.name, c.p, got, ok, c.tok, c.ok)
		}
	}
}

// Two connections dialled through one shared socket (agents behind one
// address) hear one hint per session: the one armed with the hint's token
// gets it on PeerRestarted, the other (armed with another token of the
// same key) drops it; a tokenless hint, or one under another key, is an
// unauthenticated probe for both, and an unarmed connection probes on any
// hint. The hints are sent in order on loopback, so each was read before
// the next.
func TestRestartHintTokenPerSession(t *testing.T) {
	e := newTenv(t, testConfig)
	tr, err := NewTransport("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	dial := func() *conn {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		go func() {
			if s, err := e.ln.Accept(ctx); err == nil {
				t.Cleanup(func() { _ = s.CloseWithCode(wire.CloseNormal, "") })
			}
		}()
		c, err := Dialer{TLS: e.pki.ClientConfig(t, wire.NewRunnerId(), serverName), Config: testConfig, Transport: tr}.Dial(ctx, e.ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.CloseWithCode(wire.CloseNormal, "") })
		return c.(*conn)
	}
	a, b, bare := dial(), dial(), dial()
	key := bytes.Repeat([]byte{0x42}, 32)
	session := wire.NewAgentSessionId()
	tokA := semantics.DeriveRestartToken(key, session, wire.NewTransportSessionId())
	tokB := semantics.DeriveRestartToken(key, wire.NewAgentSessionId(), wire.NewTransportSessionId())
	a.ArmRestartToken(tokA)
	b.ArmRestartToken(tokB)
	otherKey := semantics.DeriveRestartToken(bytes.Repeat([]byte{0x43}, 32), session, wire.NewTransportSessionId())
	to := tr.LocalAddr().(*net.UDPAddr).AddrPort()
	to = netip.AddrPortFrom(to.Addr().Unmap(), to.Port())
	send := func(tok semantics.RestartToken) {
		t.Helper()
		if n, err := e.ln.HintRestartTo(context.Background(), []RestartHint{{To: to, Token: tok}}, 0); err != nil || n != 1 {
			t.Fatalf("HintRestart sent %d, %v", n, err)
		}
	}
	wait := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s", what)
		}
	}
	send(tokA)
	wait("authenticated hint on the armed connection", a.PeerRestarted())
	wait("probe on the unarmed connection (a token it cannot check)", bare.PeerHints())
	send(semantics.RestartToken{}) // tokenless: everyone probes
	wait("probe on b after a tokenless hint", b.PeerHints())
	wait("probe on a after a tokenless hint", a.PeerHints())
	wait("probe on the unarmed connection after a tokenless hint", bare.PeerHints())
	if h := b.hints.probes.Load(); h != 1 {
		t.Fatalf("b heard %d unauthenticated hints, want 1 (a's token is not for it)", h)
	}
	select {
	case <-b.PeerRestarted():
		t.Fatal("b ended by a's token")
	default:
	}
	send(otherKey) // another key: the daemon's key changed; unauthenticated
	wait("probe on b after a hint under another key", b.PeerHints())
	if h := b.hints.probes.Load(); h != 2 {
		t.Fatalf("b heard %d unauthenticated hints, want 2", h)
	}
	select {
	case <-a.PeerRestarted():
		t.Fatal("a ended again by a tokenless hint or another key's")
	default:
	}
	// None of it ended a connection by itself.
	for _, c := range []*conn{a, b, bare} {
		if err := context.Cause(c.ctx); err != nil {
			t.Fatalf("connection ended after hints: %v", err)
		}
	}
}

// A restarted daemon sends one hint per session, in bursts: every
// connection behind one shared socket hears its own, however many arrive
// together (more than the 32 non-QUIC packets quic-go would queue for
// Transport.ReadNonQUICPacket before dropping the rest: the socket takes
// them out of its read path, NewHintSocket).
func TestRestartHintBurstOnSharedSocket(t *testing.T) {
	const n = 48
	e := newTenv(t, testConfig)
	tr, err := NewTransport("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	key := bytes.Repeat([]byte{0x42}, 32)
	to := tr.LocalAddr().(*net.UDPAddr).AddrPort()
	hints := make([]RestartHint, n)
	conns := make([]*conn, n)
	for i := range conns {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		go func() {
			if s, err := e.ln.Accept(ctx); err == nil {
				t.Cleanup(func() { _ = s.CloseWithCode(wire.CloseNormal, "") })
			}
		}()
		c, err := Dialer{TLS: e.pki.ClientConfig(t, wire.NewRunnerId(), serverName), Config: testConfig, Transport: tr}.Dial(ctx, e.ln.Addr().String())
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.CloseWithCode(wire.CloseNormal, "") })
		conns[i] = c.(*conn)
		tok := semantics.DeriveRestartToken(key, wire.NewAgentSessionId(), wire.NewTransportSessionId())
		conns[i].ArmRestartToken(tok)
		hints[i] = RestartHint{To: to, Token: tok}
	}
	if sent, err := e.ln.HintRestartTo(context.Background(), hints, 1_000_000); err != nil || sent != n { // one batch
		t.Fatalf("HintRestart sent %d, %v; want %d", sent, err, n)
	}
	deadline := time.After(10 * time.Second)
	for i, c := range conns {
		select {
		case <-c.PeerRestarted():
		case <-deadline:
			t.Fatalf("connection %d of %d heard no hint with its token", i, n)
		}
		if h := c.hints.probes.Load(); h != 0 {
			t.Fatalf("connection %d took %d of the others' hints as probes, want 0", i, h)
		}
	}
}
