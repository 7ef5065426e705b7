package yamux

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/backendtest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// The Upgrade form passes the whole backend conformance suite.
func TestConformanceUpgrade(t *testing.T) {
	f := factory(Config{})
	f.Name = "yamux-upgrade"
	f.Dialer = func(t testing.TB, clientTLS *tls.Config, lim semantics.Limits) semantics.BackendDialer {
		return Dialer{TLS: clientTLS, Config: Config{Limits: lim}, Upgrade: true}
	}
	backendtest.Run(t, f)
}

// One listener serves the raw form and the Upgrade form; DialContext makes
// the TCP connection.
func TestBothFormsOnOnePort(t *testing.T) {
	pki := trusttest.NewPKI(t)
	ln, err := Listen("127.0.0.1:0", pki.ServerConfig(t, "localhost"), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx := ctxT(t)
	for _, up := range []bool{false, true} {
		var dials atomic.Int64
		d := Dialer{TLS: pki.ClientConfig(t, wire.NewRunnerId(), "localhost"), Upgrade: up,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				dials.Add(1)
				var nd net.Dialer
				return nd.DialContext(ctx, network, addr)
			}}
		acc := make(chan semantics.BackendConn, 1)
		go func() { c, _ := ln.Accept(ctx); acc <- c }()
		c, err := d.Dial(ctx, ln.Addr().String())
		if err != nil {
			t.Fatalf("upgrade=%v: %v", up, err)
		}
		s := <-acc
		if s == nil {
			t.Fatal("accept failed")
		}
		want := ALPN
		if up {
			want = ALPNHTTP1
		}
		if p := c.(*Conn).ConnectionState().NegotiatedProtocol; p != want || s.(*Conn).ConnectionState().NegotiatedProtocol != want {
			t.Fatalf("upgrade=%v: ALPN %q", up, p)
		}
		if dials.Load() != 1 {
			t.Fatalf("DialContext called %d times", dials.Load())
		}
		// A stream works both ways.
		go func() {
			st, err := s.AcceptStream(ctx)
			if err == nil {
				_, _ = io.Copy(st, st)
				_ = st.Close()
			}
		}()
		st, err := c.OpenStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		_ = st.Close()
		got, err := io.ReadAll(st)
		if err != nil || string(got) != "ping" {
			t.Fatalf("upgrade=%v: echo %q %v", up, got, err)
		}
		_ = c.CloseWithCode(wire.CloseNormal, "")
		_ = s.CloseWithCode(wire.CloseNormal, "")
	}
}

// Requests that are not our Upgrade get an HTTP error and no connection;
// the dialer reports a non-101 answer.
func TestUpgradeRefusals(t *testing.T) {
	pki := trusttest.NewPKI(t)
	ln, err := Listen("127.0.0.1:0", pki.ServerConfig(t, "localhost"), Config{HandshakeTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, tc := range []struct{ req, status string }{
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "404"},
		{"GET " + UpgradePath + " HTTP/1.1\r\nHost: x\r\n\r\n", "426"},
		{"POST " + UpgradePath + " HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: " + UpgradeToken + "\r\n\r\n", "405"},
		{"GET " + UpgradePath + " HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 2*maxUpgradeHeader) + "\r\n\r\n", "431"},
		{"garbage\r\n\r\n", "400"},
	} {
		conf := pki.ClientConfig(t, wire.NewRunnerId(), "localhost")
		conf.NextProtos = []string{ALPNHTTP1}
		tc2, err := tls.Dial("tcp", ln.Addr().String(), conf)
		if err != nil {
			t.Fatal(err)
		}
		_ = tc2.SetDeadline(time.Now().Add(5 * time.Second))
		go func() { _, _ = io.WriteString(tc2, tc.req) }()
		resp, err := http.ReadResponse(bufio.NewReader(tc2), nil)
		if err != nil {
			t.Fatalf("%q: %v", tc.req[:min(len(tc.req), 40)], err)
		}
		if !strings.HasPrefix(resp.Status, tc.status) {
			t.Fatalf("%q: status %q, want %s", tc.req[:min(len(tc.req), 40)], resp.Status, tc.status)
		}
		tc2.Close()
	}

	// A plain HTTPS server (no Upgrade support) fails the dial clearly.
	srvTLS := pki.ServerConfig(t, "localhost")
	srvTLS.NextProtos = []string{ALPNHTTP1}
	hl, err := tls.Listen("tcp", "127.0.0.1:0", srvTLS)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(hl) }()
	defer srv.Close()
	d := Dialer{TLS: pki.ClientConfig(t, wire.NewRunnerId(), "localhost"), Upgrade: true}
	_, err = d.Dial(ctxT(t), hl.Addr().String())
	if !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), "404") {
		t.Fatalf("dial to a plain HTTPS server: %v", err)
	}
}
