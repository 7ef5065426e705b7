package quic

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	quicgo "github.com/quic-go/quic-go"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

const serverName = "daemon.forgeyard.test"

type tenv struct {
	pki *trusttest.PKI
	ln  *Listener
}

func newTenv(t *testing.T, cfg Config) *tenv {
	t.Helper()
	pki := trusttest.NewPKI(t)
	ln, err := Listen("127.0.0.1:0", pki.ServerConfig(t, serverName), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return &tenv{pki: pki, ln: ln}
}

func (e *tenv) dial(t *testing.T, cfg Config) (client, server semantics.BackendConn) {
	t.Helper()
	return dialAddr(t, e, cfg, e.ln.Addr().String())
}

func TestConfigValidate(t *testing.T) {
	bad := []struct {
		cfg  Config
		name string
	}{
		{Config{MaxIdleTimeout: -1}, "MaxIdleTimeout"},
		{Config{HandshakeTimeout: -1}, "HandshakeTimeout"},
		{Config{MaxIncomingStreams: -1}, "MaxIncomingStreams"},
		{Config{MaxIncomingUniStreams: 1 << 40}, "MaxIncomingUniStreams"},
		{Config{StreamReceiveWindow: 100}, "StreamReceiveWindow"},
		{Config{ConnectionReceiveWindow: 100}, "ConnectionReceiveWindow"},
		{Config{StreamReceiveWindow: 8 << 20, ConnectionReceiveWindow: 1 << 20}, "ConnectionReceiveWindow"},
		{Config{KeepAlivePeriod: time.Minute}, "KeepAlivePeriod"},
	}
	for _, b := range bad {
		err := b.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), b.name) {
			t.Errorf("%+v: Validate = %v, want an error naming %s", b.cfg, err, b.name)
		}
		if _, err := Listen("127.0.0.1:0", &tls.Config{}, b.cfg); err == nil {
			t.Errorf("%+v: Listen accepted an invalid Config", b.cfg)
		}
	}
	var zero Config
	if err := zero.Validate(); err != nil {
		t.Fatalf("zero Config: %v", err)
	}
	d := zero.withDefaults()
	if d.KeepAlivePeriod != DefaultKeepAlivePeriod || d.MaxIdleTimeout != DefaultMaxIdleTimeout ||
		d.MaxIncomingStreams != DefaultMaxIncomingStreams || d.StreamReceiveWindow != DefaultStreamReceiveWindow {
		t.Fatalf("defaults not filled: %+v", d)
	}
	qc, err := zero.QUICConfig()
	if err != nil || qc.KeepAlivePeriod != 15*time.Second || qc.MaxIdleTimeout != 45*time.Second {
		t.Fatalf("QUICConfig: %+v, %v", qc, err)
	}
	if qc, _ := (Config{KeepAlivePeriod: -1}).QUICConfig(); qc.KeepAlivePeriod != 0 {
		t.Fatalf("negative KeepAlivePeriod must disable keepalives, got %v", qc.KeepAlivePeriod)
	}
	l := semantics.Limits{MaxStreams: 10, MaxRefusals: 3}
	if c := (Config{}).WithLimits(l); c.MaxIncomingStreams != 13 || c.MaxIncomingUniStreams != 13 {
		t.Fatalf("WithLimits: %d/%d, want 13/13", c.MaxIncomingStreams, c.MaxIncomingUniStreams)
	}
	if _, err := Listen("127.0.0.1:0", nil, Config{}); err == nil {
		t.Fatal("Listen without TLS must fail")
	}
}

func TestTranslateError(t *testing.T) {
	orig := &quicgo.ApplicationError{Remote: true, ErrorCode: 5, ErrorMessage: "fenced"}
	err := TranslateError(orig)
	var ce *semantics.ConnError
	if !errors.As(err, &ce) || ce.Code != wire.CloseSessionFenced || ce.Reason != "fenced" || !ce.Remote {
		t.Fatalf("application error → %#v", err)
	}
	if _, ok := errors.AsType[*quicgo.ApplicationError](err); !ok || !errors.Is(err, net.ErrClosed) {
		t.Fatalf("translated error must keep the original and unwrap to net.ErrClosed: %v", err)
	}
	if TranslateError(err) != err {
		t.Fatal("translating twice must be a no-op")
	}
	cases := []struct {
		in   error
		code semantics.CloseCode
	}{
		{&quicgo.ApplicationError{ErrorCode: math.MaxUint32 + 1}, wire.CloseProtocolError},
		{&quicgo.IdleTimeoutError{}, wire.CloseIdleTimeout},
		{&quicgo.HandshakeTimeoutError{}, wire.CloseIdleTimeout},
		{&quicgo.TransportError{ErrorCode: quicgo.FlowControlError}, wire.CloseProtocolError},
		{&quicgo.TransportError{ErrorCode: quicgo.NoError}, wire.CloseNormal},
		{&quicgo.TransportError{ErrorCode: 0x100 + 42}, wire.CloseAuthenticationFailure},
		{&quicgo.TransportError{ErrorCode: 0x100 + 80, Remote: true}, wire.CloseInternalError}, // no handshake worker in time
		{&quicgo.StatelessResetError{}, wire.CloseShutdown},
		{fmt.Errorf("x: %w", quicgo.ErrTransportClosed), wire.CloseShutdown},
	}
	for _, c := range cases {
		err := TranslateError(c.in)
		if !errors.As(err, &ce) || ce.Code != c.code {
			t.Errorf("%v → %v, want ConnError %s", c.in, err, c.code)
		}
	}
	err = TranslateError(&quicgo.StreamError{ErrorCode: 7, Remote: true})
	var se *semantics.StreamError
	if !errors.As(err, &se) || se.Code != semantics.StreamForbidden || !se.Remote {
		t.Fatalf("stream error → %v", err)
	}
	err = TranslateError(&quicgo.StreamError{ErrorCode: 1 << 40})
	if !errors.As(err, &se) || se.Code != semantics.StreamProtocolError {
		t.Fatalf("foreign stream code → %v", err)
	}
	for _, keep := range []error{nil, io.EOF, os.ErrDeadlineExceeded, context.Canceled, quicgo.ErrStreamClosed} {
		if got := TranslateError(keep); got != keep {
			t.Errorf("TranslateError(%v) = %v, want it unchanged", keep, got)
		}
	}
}

// A client that offers only another ALPN cannot connect; one whose server
// negotiates another ALPN is rejected by our Dialer.
func TestALPNMismatchRejected(t *testing.T) {
	e := newTenv(t, testConfig)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bad := e.pki.ClientConfig(t, wire.NewRunnerId(), serverName)
	bad.NextProtos = []string{"h3"}
	if qc, err := quicgo.DialAddr(ctx, e.ln.Addr().String(), bad, &quicgo.Config{}); err == nil {
		_ = qc.CloseWithError(0, "")
		t.Fatal("a client offering only h3 connected to a forgeyard/1 listener")
	}

	// A raw quic-go server speaking h3 only; our client offers forgeyard/1
	// plus the caller's h3, the server picks h3, the Dialer must refuse.
	srvTLS := e.pki.ServerConfig(t, serverName)
	srvTLS.NextProtos = []string{"h3"}
	raw, err := quicgo.ListenAddr("127.0.0.1:0", srvTLS, &quicgo.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	go func() {
		for {
			c, err := raw.Accept(ctx)
			if err != nil {
				return
			}
			go func() { <-c.Context().Done() }()
		}
	}()
	cli := e.pki.ClientConfig(t, wire.NewRunnerId(), serverName)
	cli.NextProtos = []string{"h3"}
	c, err := Dialer{TLS: cli, Config: testConfig}.Dial(ctx, raw.Addr().String())
	var ce *semantics.ConnError
	if err == nil {
		_ = c.CloseWithCode(0, "")
		t.Fatal("Dialer accepted a connection that negotiated h3")
	}
	if !errors.As(err, &ce) || ce.Code != wire.CloseProtocolError {
		t.Fatalf("ALPN mismatch: %v, want ConnError ProtocolError", err)
	}
	if cli.NextProtos[0] != "h3" || len(cli.NextProtos) != 1 {
		t.Fatalf("the caller's tls.Config was modified: %v", cli.NextProtos)
	}
}

func TestIdleTimeout(t *testing.T) {
	cfg := Config{KeepAlivePeriod: -1, MaxIdleTimeout: 300 * time.Millisecond, HandshakeTimeout: 5 * time.Second}
	e := newTenv(t, cfg)
	c, s := e.dial(t, cfg)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.AcceptStream(ctx)
	var ce *semantics.ConnError
	if !errors.As(err, &ce) || ce.Code != wire.CloseIdleTimeout {
		t.Fatalf("AcceptStream on an idle connection: %v, want ConnError IdleTimeout", err)
	}
	if el := time.Since(start); el < 250*time.Millisecond {
		t.Fatalf("idle timeout after %v, want ≥ 300ms", el)
	}
	for _, cc := range []semantics.BackendConn{c, s} {
		<-cc.Context().Done()
		cause := context.Cause(cc.Context())
		if !errors.As(cause, &ce) || ce.Code != wire.CloseIdleTimeout || ce.Remote {
			t.Fatalf("context cause %v, want semantics.IdleTimeoutError()", cause)
		}
	}
}

// With keepalives, an idle connection survives several idle timeouts. The
// idle timeout leaves room for scheduling delays on a loaded machine (a
// 200 ms timeout with 50 ms keepalives died at load 11 on 2 cores).
func TestKeepAliveKeepsIdleConnection(t *testing.T) {
	cfg := Config{KeepAlivePeriod: 100 * time.Millisecond, MaxIdleTimeout: 600 * time.Millisecond, HandshakeTimeout: 5 * time.Second}
	e := newTenv(t, cfg)
	c, _ := e.dial(t, cfg)
	select {
	case <-c.Context().Done():
		t.Fatalf("connection died despite keepalives: %v", context.Cause(c.Context()))
	case <-time.After(1800 * time.Millisecond): // three idle timeouts
	}
}

// Closing the Listener stops accepting but keeps established connections.
func TestListenerCloseKeepsConnections(t *testing.T) {
	e := newTenv(t, testConfig)
	c, s := e.dial(t, testConfig)
	if err := e.ln.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.ln.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.ln.Accept(ctx); err == nil {
		t.Fatal("Accept after Close succeeded")
	}
	st, err := c.OpenStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write([]byte("still here")); err != nil {
		t.Fatal(err)
	}
	_ = st.Close()
	ps, err := s.AcceptStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(ps); err != nil || string(b) != "still here" {
		t.Fatalf("read %q, %v", b, err)
	}
	_ = s.CloseWithCode(wire.CloseShutdown, "done")
	<-c.Context().Done()
	// The UDP socket goes with the last connection.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if e.ln.ep.users.Closed() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("endpoint still open after the listener and its last connection closed")
		}
		time.Sleep(5 * time.Millisecond) // no event to await: release runs in an AfterFunc
	}
}

// Connection window growth beyond the initial window is charged to the
// shared budget and returned when the connection closes.
func TestMemoryBudget(t *testing.T) {
	budget := NewMemoryBudget(2 << 20)
	// WindowRate -1: growth bounded by the budget alone (on loopback the
	// path bound would keep the initial window; TestWindowFitsPath).
	cfg := Config{HandshakeTimeout: 5 * time.Second, Budget: budget, StreamReceiveWindow: 4 << 20, ConnectionReceiveWindow: 8 << 20, WindowRate: -1}
	e := newTenv(t, cfg)
	c, s := e.dial(t, cfg)
	const total = 16 << 20
	if n := sendUni(t, c, s, total); n != total {
		t.Fatalf("received %d bytes, want %d", n, total)
	}
	if used := budget.Used(); used > 2<<20 {
		t.Fatalf("budget used %d > limit", used)
	}
	t.Logf("budget used after 16 MiB: %d bytes", budget.Used())
	_ = s.CloseWithCode(wire.CloseNormal, "")
	<-s.Context().Done()
	deadline := time.Now().Add(5 * time.Second)
	for budget.Used() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("budget still holds %d bytes after close", budget.Used())
		}
		time.Sleep(5 * time.Millisecond) // release runs in an AfterFunc; no event to await
	}
}

func TestUDPBufferAdvice(t *testing.T) {
	if ok, advice := udpBufferAdvice(212992, 212992); ok || !strings.Contains(advice, UDPBufferFix) {
		t.Fatalf("default Linux limits: ok=%v advice=%q, want !ok naming the fix", ok, advice)
	}
	if ok, _ := udpBufferAdvice(7500000, 212992); ok {
		t.Fatal("a small wmem_max must be reported")
	}
	if ok, _ := udpBufferAdvice(7500000, 7500000); !ok {
		t.Fatal("the advised values must be ok")
	}
	if ok, _ := udpBufferAdvice(4<<20, 4<<20); !ok {
		t.Fatal("4 MiB limits give quic-go its 7 MiB (the kernel doubles): ok")
	}
	ok, advice := UDPBufferAdvice()
	t.Logf("this host: ok=%v %s", ok, advice)
	if advice == "" {
		t.Fatal("empty advice")
	}
}

// Close after the peer stopped the stream reports the peer's code like a
// Write would (quic-go itself returns a plain error from Close there).
func TestCloseAfterPeerStopSending(t *testing.T) {
	e := newTenv(t, Config{})
	client, server := e.dial(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := client.OpenStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	ss, err := server.AcceptStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ss.CancelRead(semantics.StreamForbidden)
	// Wait until the STOP_SENDING has arrived: a write then fails with it.
	var se *semantics.StreamError
	for !errors.As(err, &se) {
		if ctx.Err() != nil {
			t.Fatal("STOP_SENDING never arrived")
		}
		_, err = st.Write([]byte("y"))
	}
	err = st.Close()
	if !errors.As(err, &se) || se.Code != semantics.StreamForbidden || !se.Remote {
		t.Fatalf("Close after STOP_SENDING = %v, want *StreamError{Forbidden, Remote}", err)
	}
}
