package quic

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	quicgo "github.com/quic-go/quic-go"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// Every refused attempt of a burst hears its refusal. quic-go's own
// CONNECTION_REFUSED queue holds 4 packets and drops the rest, so most
// Initials of a burst refused at once would hear nothing and fail at
// their handshake idle timeout; the filter answers each one. The burst
// is crafted client Initials (a valid header, a fresh connection ID each,
// padded to 1200 bytes: the server decides before decrypting), sent in
// rounds of 200 from one socket; every refusal the listener counted must
// come back, addressed to the attempt it refused.
func TestEveryRefusalHeard(t *testing.T) {
	const rounds, perRound = 5, 200
	cfg := testConfig
	cfg.Admit = func(net.Addr) error { return errors.New("connection cap reached") }
	e := newTenv(t, cfg)
	c := mustUDP(t)
	defer c.Close()
	_ = c.SetReadBuffer(4 << 20)
	server := e.ln.Addr().(*net.UDPAddr)
	heard := map[uint32]bool{}
	buf := make([]byte, 2048)
	for r := range rounds {
		for i := range perRound {
			id := uint32(r*perRound + i)
			if _, err := c.WriteToUDP(craftedInitial(id), server); err != nil {
				t.Fatal(err)
			}
		}
		// Read this round's answers: each one arrives within the round
		// trip of a loopback socket; stop at the first quiet half second.
		for {
			_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			n, _, err := c.ReadFromUDP(buf)
			if err != nil {
				break
			}
			// A long-header Initial to our source connection ID (4 bytes:
			// the attempt's number).
			p := buf[:n]
			if n > 10 && p[0]&0xc0 == 0xc0 && p[5] == 4 {
				heard[uint32(p[6])<<24|uint32(p[7])<<16|uint32(p[8])<<8|uint32(p[9])] = true
			}
			if len(heard) == (r+1)*perRound {
				break
			}
		}
	}
	refused := e.ln.adm.Stats().Refused
	if refused < rounds*perRound/2 {
		t.Fatalf("the listener refused only %d of %d Initials: the burst did not reach it", refused, rounds*perRound)
	}
	if int64(len(heard)) < refused {
		t.Fatalf("%d refusals counted, %d heard: refused attempts heard nothing", refused, len(heard))
	}
	if u := e.ln.adm.Stats().RefusalsUnsent; u != 0 {
		t.Fatalf("%d refusals unsent although every one was heard", u)
	}
}

// A refusal the writer's queue has no room for is counted as unsent
// (HandshakeStats.RefusalsUnsent), not lost silently.
func TestRefusalsUnsentCounted(t *testing.T) {
	c := mustUDP(t)
	defer c.Close()
	f := newInitialFilter(c, func(net.Addr) (string, bool) { return "overloaded", true })
	f.out = make(chan refusalJob) // no room, and no writer: every refusal finds the queue full
	f.sending.Store(true)
	to := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}
	const n = 5
	for i := range n {
		if !f.refuse(craftedInitial(uint32(i)), to) {
			t.Fatalf("Initial %d not refused", i)
		}
	}
	a := &Admission{unsent: &f.dropped}
	if got := a.Stats().RefusalsUnsent; got != n {
		t.Fatalf("RefusalsUnsent %d, want %d", got, n)
	}
}

// craftedInitial is a client Initial opening attempt id: QUIC v1, a fresh
// 8-byte destination connection ID, id as its 4-byte source connection
// ID, no token, padded to 1200 bytes (the payload is not valid: the
// server's admission decides before it decrypts).
func craftedInitial(id uint32) []byte {
	p := []byte{0xc3, 0, 0, 0, 1, 8}
	p = append(p, byte(id>>24), byte(id>>16), byte(id>>8), byte(id), 0xfe, 0xed, 0xfa, 0xce)
	p = append(p, 4, byte(id>>24), byte(id>>16), byte(id>>8), byte(id))
	p = append(p, 0) // no token
	rest := 1200 - len(p) - 2
	p = append(p, 0x40|byte(rest>>8), byte(rest))
	return append(p, make([]byte, rest)...)
}

// A refusal carries an appointment: refused attempts are told to come
// back spread at the measured handshake rate, and a dial whose hint
// outlasts it ends with an error whose RetryAfter says when.
func TestRefusalCarriesAppointment(t *testing.T) {
	cfg := testConfig
	cfg.Admit = func(net.Addr) error { return errors.New("busy") }
	e := newTenv(t, cfg)
	e.ln.adm.rate.Set(0.5) // one handshake per 2 s: appointments 2 s apart
	client := e.pki.ClientConfig(t, wire.NewRunnerId(), serverName)
	tr := &quicgo.Transport{Conn: mustUDP(t)}
	defer tr.Close()
	ua := e.ln.Addr().(*net.UDPAddr)
	var hints []time.Duration
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := tr.Dial(ctx, ua, client, &quicgo.Config{HandshakeIdleTimeout: 2 * time.Second})
		cancel()
		hint, refused := refusalHint(err)
		if !refused {
			t.Fatalf("dial: %v, want a CONNECTION_REFUSED", err)
		}
		hints = append(hints, hint)
	}
	// The first refusal finds no one waiting: come back at once (no hint,
	// the dialer's own backoff); each later one a handshake later.
	for i, h := range hints {
		want := time.Duration(i) * 2 * time.Second
		if h > want || h < want-100*time.Millisecond {
			t.Fatalf("hints %v: refusal %d says %v, want ≈ %v", hints, i, h, want)
		}
	}
	// A dialer with less time than the hint returns it to its caller.
	dc := testConfig
	dc.RefusalBackoff = DefaultRefusalBackoff
	dc.HandshakeTimeout = time.Second
	_, err := Dialer{TLS: client, Config: dc}.Dial(context.Background(), ua.String())
	h, ok := errors.AsType[interface {
		error
		RetryAfter() time.Duration
	}](err)
	if !ok || h.RetryAfter() < 5*time.Second {
		t.Fatalf("dial with 1 s against a 6 s appointment: %v, want an error with RetryAfter ≥ 6 s", err)
	}
	var ce *semantics.ConnError
	if !errors.As(err, &ce) || ce.Code != wire.CloseOverloaded {
		t.Fatalf("the retry error %v does not wrap the refusal", err)
	}
}

func mustUDP(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Only a client's first Initial of a new attempt is decided: not a
// short-header packet, not an Initial with a token (after a Retry, or a
// NEW_TOKEN), not one to a short (server-chosen) connection ID, not
// another version or packet type.
func TestParseNewInitial(t *testing.T) {
	dcid := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	initial := func(first byte, version uint32, dcid []byte, token byte) []byte {
		p := []byte{first, byte(version >> 24), byte(version >> 16), byte(version >> 8), byte(version)}
		p = append(p, byte(len(dcid)))
		p = append(p, dcid...)
		p = append(p, 4, 9, 9, 9, 9, token)
		return append(p, make([]byte, 40)...)
	}
	for _, c := range []struct {
		name string
		p    []byte
		want bool
	}{
		{"v1 Initial", initial(0xc3, version1, dcid, 0), true},
		{"v2 Initial", initial(0xd3, version2, dcid, 0), true},
		{"v1 0-RTT", initial(0xd3, version1, dcid, 0), false},
		{"v2 type 0 (0-RTT in v2)", initial(0xc3, version2, dcid, 0), false},
		{"with a token", initial(0xc3, version1, dcid, 5), false},
		{"server connection ID", initial(0xc3, version1, dcid[:4], 0), false},
		{"unknown version", initial(0xc3, 0x1a2a3a4a, dcid, 0), false},
		{"short header", append([]byte{0x43}, dcid...), false},
		{"truncated", initial(0xc3, version1, dcid, 0)[:10], false},
	} {
		h, ok := parseNewInitial(c.p)
		if ok != c.want {
			t.Errorf("%s: parsed %v, want %v", c.name, ok, c.want)
		}
		if ok && (string(h.dcid) != string(dcid) || len(h.scid) != 4) {
			t.Errorf("%s: header %+v", c.name, h)
		}
	}
}

// The hint is read from the reason phrase, bounded, and only from a
// remote CONNECTION_REFUSED.
func TestRefusalHint(t *testing.T) {
	for _, c := range []struct {
		err     error
		hint    time.Duration
		refused bool
	}{
		{&quicgo.TransportError{Remote: true, ErrorCode: quicgo.ConnectionRefused, ErrorMessage: "overloaded; retry_after_ms=1500"}, 1500 * time.Millisecond, true},
		{&quicgo.TransportError{Remote: true, ErrorCode: quicgo.ConnectionRefused, ErrorMessage: "overloaded"}, 0, true},
		{&quicgo.TransportError{Remote: true, ErrorCode: quicgo.ConnectionRefused, ErrorMessage: "retry_after_ms=99999999"}, maxRetryHint, true},
		{&quicgo.TransportError{Remote: false, ErrorCode: quicgo.ConnectionRefused, ErrorMessage: "retry_after_ms=10"}, 0, false},
		{&quicgo.TransportError{Remote: true, ErrorCode: quicgo.ProtocolViolation, ErrorMessage: "retry_after_ms=10"}, 0, false},
		{errors.New("retry_after_ms=10"), 0, false},
	} {
		h, r := refusalHint(c.err)
		if h != c.hint || r != c.refused {
			t.Errorf("%v: hint %v refused %v, want %v %v", c.err, h, r, c.hint, c.refused)
		}
	}
	if !strings.HasPrefix(refusalHintKey, "retry_after_ms") {
		t.Fatal("the hint key is part of the protocol (docs/protocols/internal/admission.md)")
	}
}

// TestAdmissionWindow (real loopback QUIC): with the host's backlog
// reported (Config.Backlog), attempts are refused once those in progress
// reach AdmissionWindow of the host's intake rate, and the refusal's
// appointment is spread at that rate when it is the slower one.
func TestAdmissionWindow(t *testing.T) {
	var mu sync.Mutex
	pending, rate := 0, 0.0
	cfg := testConfig
	cfg.Backlog = func() (int, float64) { mu.Lock(); defer mu.Unlock(); return pending, rate }
	e := newTenv(t, cfg)
	client := e.pki.ClientConfig(t, wire.NewRunnerId(), serverName)
	client.NextProtos = []string{ALPN}
	ua := e.ln.Addr().(*net.UDPAddr)
	dial := func() error {
		tr := &quicgo.Transport{Conn: mustUDP(t)}
		defer tr.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		qc, err := tr.Dial(ctx, ua, client, &quicgo.Config{HandshakeIdleTimeout: 2 * time.Second})
		if err == nil {
			_ = qc.CloseWithError(0, "")
		}
		return err
	}
	// Below the floor (512 before any rate is measured): admitted.
	mu.Lock()
	pending = MinAdmissionWindow - 1
	mu.Unlock()
	if err := dial(); err != nil {
		t.Fatalf("dial with %d awaiting registration (window %d): %v", MinAdmissionWindow-1, MinAdmissionWindow, err)
	}
	// At it: refused before the handshake, with no hint while no rate is known.
	mu.Lock()
	pending = MinAdmissionWindow
	mu.Unlock()
	if h, refused := refusalHint(dial()); !refused || h != 0 {
		t.Fatalf("at the window: refused %v, hint %v; want refused, no hint", refused, h)
	}
	// A measured intake of 1,000/s makes the window 2,000; at 2,000 the
	// refusal's appointment is the backlog drained to half the window
	// (1 s), then 1 ms apart.
	mu.Lock()
	pending, rate = 2000, 1000
	mu.Unlock()
	h1, refused := refusalHint(dial())
	h2, _ := refusalHint(dial())
	if !refused || h1 < 800*time.Millisecond || h1 > 1100*time.Millisecond {
		t.Fatalf("window 2,000 full at 1,000/s: refused %v, hint %v; want ≈ 1 s", refused, h1)
	}
	if h2 < h1 {
		t.Fatalf("second appointment %v before the first %v", h2, h1)
	}
	if st := e.ln.adm.Stats(); st.Refused != 3 {
		t.Fatalf("refused %d attempts, want 3", st.Refused)
	}
}
