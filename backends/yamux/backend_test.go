package yamux

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"forgeyard.dev/transport/backends/backendtest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

func factory(cfg Config) backendtest.Factory {
	return backendtest.Factory{
		Name: "yamux",
		Listen: func(t testing.TB, serverTLS *tls.Config, lim semantics.Limits) (semantics.BackendListener, string) {
			cfg := cfg
			cfg.Limits = lim
			l, err := Listen("127.0.0.1:0", serverTLS, cfg)
			if err != nil {
				t.Fatalf("Listen: %v", err)
			}
			t.Cleanup(func() { _ = l.Close() })
			return l, l.Addr().String()
		},
		Dialer: func(t testing.TB, clientTLS *tls.Config, lim semantics.Limits) semantics.BackendDialer {
			cfg := cfg
			cfg.Limits = lim
			return Dialer{TLS: clientTLS, Config: cfg}
		},
		Caps: backendtest.Caps{RealNetwork: true},
	}
}

func TestConformance(t *testing.T) { backendtest.Run(t, factory(Config{})) }

func BenchmarkBackend(b *testing.B) { backendtest.RunBenchmarks(b, factory(Config{})) }

// pair is a local helper: a listener, one dialed connection and its
// accepted peer, all closed at cleanup.
type testPair struct {
	ln             *Listener
	client, server *Conn
}

func newPair(t testing.TB, cfg Config) testPair { return newPairCfg(t, cfg, cfg) }

func newPairCfg(t testing.TB, cfg, clientCfg Config) testPair {
	t.Helper()
	pki := trusttest.NewPKI(t)
	ln, err := Listen("127.0.0.1:0", pki.ServerConfig(t, "localhost"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acc := make(chan semantics.BackendConn, 1)
	go func() {
		c, _ := ln.Accept(ctx)
		acc <- c
	}()
	d := Dialer{TLS: pki.ClientConfig(t, wire.NewRunnerId(), "localhost"), Config: clientCfg}
	c, err := d.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	s := <-acc
	if s == nil {
		t.Fatal("Accept failed")
	}
	p := testPair{ln: ln, client: c.(*Conn), server: s.(*Conn)}
	t.Cleanup(func() {
		_ = p.client.CloseWithCode(wire.CloseNormal, "")
		_ = p.server.CloseWithCode(wire.CloseNormal, "")
	})
	return p
}

// leakCheck verifies, after every cleanup of t has run, that no goroutine
// started during t is left.
func leakCheck(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func wantConnErr(t *testing.T, what string, err error, code wire.CloseCode, reason string, remote bool) {
	t.Helper()
	var ce *semantics.ConnError
	if !errors.As(err, &ce) || ce.Code != code || ce.Remote != remote || (reason != "" && ce.Reason != reason) {
		t.Fatalf("%s: got %v (%T), want ConnError{%s, %q, remote=%v}", what, err, err, code, reason, remote)
	}
	if !errors.Is(err, net.ErrClosed) {
		t.Fatalf("%s: %v does not unwrap to net.ErrClosed", what, err)
	}
}

func TestCloseCodeRoundTrip(t *testing.T) {
	leakCheck(t)
	for _, code := range []wire.CloseCode{wire.CloseNormal, wire.CloseSessionFenced, wire.CloseRunnerDisabled, 4000} {
		p := newPair(t, Config{})
		// A reader blocked on the peer's stream must be released with the code.
		st, err := p.client.OpenStream(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		srv, err := p.server.AcceptStream(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		readErr := make(chan error, 1)
		go func() {
			_, err := srv.Read(make([]byte, 1))
			readErr <- err
		}()
		start := time.Now()
		if err := p.client.CloseWithCode(code, "bye now"); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > 500*time.Millisecond {
			t.Errorf("CloseWithCode took %v; the peer should drop the connection promptly", d)
		}
		wantConnErr(t, "peer Read", <-readErr, code, "bye now", true)
		<-p.server.Context().Done()
		wantConnErr(t, "peer context cause", context.Cause(p.server.Context()), code, "bye now", true)
		wantConnErr(t, "local context cause", context.Cause(p.client.Context()), code, "bye now", false)
		if _, err := st.Write([]byte("x")); err == nil {
			t.Fatal("write after local close succeeded")
		} else {
			wantConnErr(t, "local Write after close", err, code, "bye now", false)
		}
		if _, err := p.server.OpenStream(ctxT(t)); err == nil {
			t.Fatal("OpenStream on closed conn succeeded")
		}
		_ = p.server.CloseWithCode(wire.CloseNormal, "")
	}
}

// A session that dies without a close record is a network failure, not a
// clean close, and is distinguishable from CloseWithCode.
func TestConnectionLostWithoutCloseFrame(t *testing.T) {
	p := newPair(t, Config{})
	srv := make(chan error, 1)
	go func() {
		_, err := p.server.AcceptStream(ctxT(t))
		srv <- err
	}()
	_ = p.client.sc.Conn.(*tls.Conn).NetConn().Close() // cut the TCP connection under TLS
	err := <-srv
	wantConnErr(t, "peer after cut", err, wire.CloseInternalError, "connection lost", true)
}

func TestIdleTimeout(t *testing.T) {
	cfg := Config{KeepAliveInterval: 50 * time.Millisecond, IdleTimeout: 300 * time.Millisecond}
	p := newPair(t, cfg)
	// Keepalives keep a healthy idle connection up past IdleTimeout.
	select {
	case <-p.server.Context().Done():
		t.Fatalf("idle but healthy connection closed: %v", context.Cause(p.server.Context()))
	case <-time.After(3 * cfg.IdleTimeout):
	}

	// A silent peer: the client never pings and tolerates a minute of
	// silence; the server stops pinging, so it receives nothing at all.
	p = newPairCfg(t, cfg, Config{KeepAliveInterval: time.Hour, IdleTimeout: 2 * time.Hour})
	p.server.stopKeepalive()
	select {
	case <-p.server.Context().Done():
	case <-time.After(20 * cfg.IdleTimeout):
		t.Fatal("idle connection was not closed")
	}
	wantConnErr(t, "idle", context.Cause(p.server.Context()), wire.CloseIdleTimeout, "idle timeout", false)
	// The silent peer sees a network failure, not a clean close.
	<-p.client.Context().Done()
	wantConnErr(t, "peer of idle closer", context.Cause(p.client.Context()), wire.CloseInternalError, "connection lost", true)
}

func TestResetCodes(t *testing.T) {
	leakCheck(t)
	p := newPair(t, Config{})
	for i := 0; i < 20; i++ { // repeated: the reset record must always beat the FIN
		st, err := p.client.OpenStream(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		srv, err := p.server.AcceptStream(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		st.CancelWrite(semantics.StreamForbidden)
		st.CancelRead(semantics.StreamShutdown)
		buf := make([]byte, 16)
		var rerr error
		for j := 0; j < 10 && rerr == nil; j++ {
			_, rerr = srv.Read(buf)
		}
		wantStreamErr(t, "peer Read after CancelWrite", rerr, semantics.StreamForbidden, true)
		var werr error
		for j := 0; j < 1000 && werr == nil; j++ {
			_, werr = srv.Write(buf)
		}
		wantStreamErr(t, "peer Write after CancelRead", werr, semantics.StreamShutdown, true)
		// Local side reports its own codes.
		_, err = st.Write(buf)
		wantStreamErr(t, "local Write after CancelWrite", err, semantics.StreamForbidden, false)
		_, err = st.Read(buf)
		wantStreamErr(t, "local Read after CancelRead", err, semantics.StreamShutdown, false)
		srv.Close()
	}
	// Streams leave the tables once both sides are done.
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.client.mu.Lock()
		nc := len(p.client.streams)
		p.client.mu.Unlock()
		p.server.mu.Lock()
		ns, inc := len(p.server.streams), p.server.incoming
		p.server.mu.Unlock()
		if nc == 0 && ns == 0 && inc == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("streams not released: client %d, server %d (incoming %d)", nc, ns, inc)
		}
		time.Sleep(5 * time.Millisecond) // polling: no event for table removal
	}
}

func wantStreamErr(t *testing.T, what string, err error, code semantics.StreamErrorCode, remote bool) {
	t.Helper()
	var se *semantics.StreamError
	if !errors.As(err, &se) || se.Code != code || se.Remote != remote {
		t.Fatalf("%s: got %v (%T), want StreamError{%s, remote=%v}", what, err, err, code, remote)
	}
}

func TestDeadlineUnblocksHungRead(t *testing.T) {
	leakCheck(t)
	p := newPair(t, Config{})
	st, err := p.client.OpenUniStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := p.server.AcceptUniStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	_ = srv.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	start := time.Now()
	_, err = srv.Read(make([]byte, 1))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read: got %v, want os.ErrDeadlineExceeded", err)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Read error %v is not a net.Error timeout", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("deadline took %v", d)
	}
	// Extending the deadline works.
	_ = srv.SetReadDeadline(time.Time{})
	if _, err := st.Write([]byte("z")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(srv, b); err != nil || b[0] != 'z' {
		t.Fatalf("Read after extending deadline: %q %v", b, err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Read(b); err != io.EOF {
		t.Fatalf("after FIN: got %v, want io.EOF", err)
	}
}

func TestWriteDeadline(t *testing.T) {
	p := newPair(t, Config{})
	st, err := p.client.OpenStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	_ = st.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	buf := make([]byte, 1<<20)
	var werr error
	for i := 0; i < 64 && werr == nil; i++ { // 64 MiB > the 16 MiB window: must block
		_, werr = st.Write(buf)
	}
	if !errors.Is(werr, os.ErrDeadlineExceeded) {
		t.Fatalf("Write: got %v, want os.ErrDeadlineExceeded", werr)
	}
}

func TestALPNAndPeerCerts(t *testing.T) {
	p := newPair(t, Config{})
	for name, c := range map[string]*Conn{"client": p.client, "server": p.server} {
		st := c.ConnectionState()
		if st.NegotiatedProtocol != ALPN || st.Version != tls.VersionTLS13 {
			t.Fatalf("%s: ALPN %q version %x", name, st.NegotiatedProtocol, st.Version)
		}
		if len(st.PeerCertificates) == 0 || len(st.VerifiedChains) == 0 {
			t.Fatalf("%s: no verified peer certificate", name)
		}
		if c.Backend() != "yamux" {
			t.Fatalf("Backend() = %q", c.Backend())
		}
	}
	// A client without our ALPN is refused by the server's TLS stack.
	pki := trusttest.NewPKI(t)
	ln, err := Listen("127.0.0.1:0", pki.ServerConfig(t, "localhost"), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conf := pki.ClientConfig(t, wire.NewRunnerId(), "localhost")
	conf.NextProtos = []string{"h2"}
	tc, err := tls.Dial("tcp", ln.Addr().String(), conf)
	if err == nil {
		_ = tc.Close()
		t.Fatal("TLS handshake with ALPN h2 succeeded")
	}
}

func TestRejectedClientFailsDial(t *testing.T) {
	pki := trusttest.NewPKI(t)
	ln, err := Listen("127.0.0.1:0", pki.ServerConfig(t, "localhost"), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d := Dialer{TLS: pki.ExpiredClientConfig(t, wire.NewRunnerId(), "localhost")}
	_, err = d.Dial(ctxT(t), ln.Addr().String())
	if !errors.Is(err, ErrHandshake) {
		t.Fatalf("Dial with expired cert: got %v, want ErrHandshake", err)
	}
}

func TestIncomingStreamCap(t *testing.T) {
	p := newPair(t, Config{MaxIncomingStreams: 2})
	// The cap is applied by the accept loop, which the first Accept call
	// starts.
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.server.AcceptStream(done); err != context.Canceled {
		t.Fatalf("AcceptStream with a cancelled context: %v", err)
	}
	var open []semantics.RawStream
	for i := 0; i < 3; i++ {
		st, err := p.client.OpenStream(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, st)
	}
	// The third is refused with StreamRefused on both sides.
	_, err := open[2].Read(make([]byte, 1))
	wantStreamErr(t, "Read on refused stream", err, semantics.StreamRefused, true)
	for i := 0; i < 2; i++ {
		if _, err := p.server.AcceptStream(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []Config{
		{MaxStreamWindow: 1024},
		{KeepAliveInterval: -1},
		{IdleTimeout: time.Second, KeepAliveInterval: 2 * time.Second},
		{AcceptBacklog: -1},
		{MaxIncomingStreams: -5},
		{HandshakeTimeout: -1},
	}
	for i, c := range bad {
		if err := c.Validate(); err == nil {
			t.Errorf("config %d: Validate accepted %+v", i, c)
		}
		if _, err := Listen("127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{{}}}, c); err == nil {
			t.Errorf("config %d: Listen accepted %+v", i, c)
		}
	}
	var zero Config
	if err := zero.Validate(); err != nil {
		t.Fatalf("zero Config: %v", err)
	}
}

func TestMalformedControlRecord(t *testing.T) {
	p := newPair(t, Config{})
	// Write garbage (an unknown record kind) on the client's control stream.
	// The write may race with the server's reaction; only the outcome counts.
	p.client.ctrlMu.Lock()
	_, _ = p.client.ctrl.Write([]byte{1, 9})
	p.client.ctrlMu.Unlock()
	<-p.client.Context().Done()
	wantConnErr(t, "client after sending garbage", context.Cause(p.client.Context()), wire.CloseProtocolError, "", true)
}

// Connections handshaken but never accepted are closed with CloseShutdown
// when the listener closes; Close returns.
func TestListenerCloseClosesPending(t *testing.T) {
	leakCheck(t)
	pki := trusttest.NewPKI(t)
	ln, err := Listen("127.0.0.1:0", pki.ServerConfig(t, "localhost"), Config{})
	if err != nil {
		t.Fatal(err)
	}
	d := Dialer{TLS: pki.ClientConfig(t, wire.NewRunnerId(), "localhost")}
	var clients []semantics.BackendConn
	for range 3 {
		c, err := d.Dial(ctxT(t), ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	// Wait until all three finished their server handshake (no event
	// exists for that; poll with a deadline). Handshakes still running when
	// Close is called are aborted, which the client sees as a network
	// failure.
	for deadline := time.Now().Add(10 * time.Second); len(ln.ready) < 3; {
		if time.Now().After(deadline) {
			t.Fatalf("only %d connections handshaken", len(ln.ready))
		}
		time.Sleep(time.Millisecond)
	}
	done := make(chan error, 1)
	go func() { done <- ln.Close() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Listener.Close did not return")
	}
	for i, c := range clients {
		select {
		case <-c.Context().Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("client %d not closed", i)
		}
		wantConnErr(t, "pending conn", context.Cause(c.Context()), wire.CloseShutdown, "listener closed", true)
		_ = c.CloseWithCode(wire.CloseNormal, "")
	}
	if _, err := ln.Accept(ctxT(t)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
}

// pausableProxy forwards one TCP connection; pause stops reading from the
// client, so the client's socket fills up as if the peer hung.
type pausableProxy struct {
	ln     net.Listener
	paused chan struct{}
	wg     sync.WaitGroup
	conns  []net.Conn
	mu     sync.Mutex
}

func newProxy(t *testing.T, target string) *pausableProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pausableProxy{ln: ln, paused: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", target)
		if err != nil {
			_ = c.Close()
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { // server → client, always
			defer p.wg.Done()
			_, _ = io.Copy(c, s)
		}()
		go func() { // client → server until paused
			defer p.wg.Done()
			buf := make([]byte, 32<<10)
			for {
				select {
				case <-p.paused:
					return
				default:
				}
				n, err := c.Read(buf)
				if n > 0 {
					if _, err := s.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// hashicorp/yamux#142: a peer that stops reading must not leave writers
// (or the session) hung; the socket write deadline ends the connection
// with CloseIdleTimeout "write stalled".
func TestStalledPeerEndsConnection(t *testing.T) {
	pki := trusttest.NewPKI(t)
	ln, err := Listen("127.0.0.1:0", pki.ServerConfig(t, "localhost"), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	px := newProxy(t, ln.Addr().String())
	// WriteTimeout is long enough for the 1 MiB warm-up below under -race on a loaded machine.
	cfg := Config{WriteTimeout: 2 * time.Second, KeepAliveInterval: 5 * time.Second, IdleTimeout: 20 * time.Second}
	d := Dialer{TLS: pki.ClientConfig(t, wire.NewRunnerId(), "localhost"), Config: cfg}
	bc, err := d.Dial(ctxT(t), px.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer bc.CloseWithCode(wire.CloseNormal, "")
	srv, err := ln.Accept(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.CloseWithCode(wire.CloseNormal, "")
	st, err := bc.OpenUniStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	// The server must have the stream, and have read enough of it to grant
	// the full stream window (16 MiB), before the proxy stops forwarding:
	// then what the client may send after the pause cannot fit in the
	// sockets' buffers, whatever their size. (With only yamux's initial
	// 256 KiB window the test depended on the kernel's buffer sizes and the
	// segment sizes of the writes: all of it could fit, and the writer then
	// waited for window, not on the socket.)
	rs, err := srv.AcceptUniStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	const warm = 1 << 20
	warmed := make(chan error, 1)
	go func() { // reads (granting window) until the pause and after
		_, err := io.CopyN(io.Discard, rs, warm)
		warmed <- err
		_, _ = io.Copy(io.Discard, rs)
	}()
	if _, err := st.Write(make([]byte, warm)); err != nil {
		t.Fatal(err)
	}
	if err := <-warmed; err != nil {
		t.Fatal(err)
	}
	close(px.paused)
	start := time.Now()
	buf := make([]byte, 1<<20)
	var werr error
	for i := 0; i < 1024 && werr == nil; i++ { // bounded: 1 GiB
		_, werr = st.Write(buf)
	}
	wantConnErr(t, "Write to a stalled peer", werr, wire.CloseIdleTimeout, "write stalled", false)
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("stall detected after %v", d)
	}
	<-bc.Context().Done()
}

// TestBulkChunkPreferred: a semantics.Conn over this backend cuts bulk
// writes into BulkChunk pieces unless its Limits say otherwise.
func TestBulkChunkPreferred(t *testing.T) {
	c, s := oursPair(t, Config{}, semantics.Config{})
	if got := c.Limits().BulkChunk; got != BulkChunk {
		t.Fatalf("client BulkChunk %d, want the backend's %d", got, BulkChunk)
	}
	if got := s.Limits().BulkChunk; got != BulkChunk {
		t.Fatalf("server BulkChunk %d, want the backend's %d", got, BulkChunk)
	}
	var scfg semantics.Config
	scfg.Limits.BulkChunk = 4 << 10
	c2, _ := oursPair(t, Config{}, scfg)
	if got := c2.Limits().BulkChunk; got != 4<<10 {
		t.Fatalf("configured BulkChunk %d, want 4096", got)
	}
}
