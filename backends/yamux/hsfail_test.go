package yamux

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/backendtest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

func hsfailFactory(upgrade bool) backendtest.HandshakeFailureFactory {
	return backendtest.HandshakeFailureFactory{
		Name: "yamux",
		Listen: func(t testing.TB, serverTLS *tls.Config, hook func(semantics.HandshakeFailure)) (semantics.BackendListener, string) {
			l, err := Listen("127.0.0.1:0", serverTLS, Config{OnHandshakeFailure: hook})
			if err != nil {
				t.Fatalf("Listen: %v", err)
			}
			return l, l.Addr().String()
		},
		Dialer: func(t testing.TB, clientTLS *tls.Config) semantics.BackendDialer {
			return Dialer{TLS: clientTLS, Upgrade: upgrade}
		},
	}
}

func TestHandshakeFailureHook(t *testing.T) {
	t.Run("Raw", func(t *testing.T) { backendtest.RunHandshakeFailures(t, hsfailFactory(false)) })
	t.Run("Upgrade", func(t *testing.T) { backendtest.RunHandshakeFailures(t, hsfailFactory(true)) })
}

// TestHandshakeFailureHookProtocol: bytes that are not TLS, a connection
// closed before its first record, and a TLS client whose HTTP/1.1 Upgrade
// request is wrong are reported as protocol; a handshake that does not
// finish in HandshakeTimeout as timeout.
func TestHandshakeFailureHookProtocol(t *testing.T) {
	pki := trusttest.NewPKI(t)
	events := make(chan semantics.HandshakeFailure, 8)
	l, err := Listen("127.0.0.1:0", pki.ServerConfig(t, "localhost"),
		Config{HandshakeTimeout: 500 * time.Millisecond, OnHandshakeFailure: func(f semantics.HandshakeFailure) { events <- f }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	want := func(name string, reason semantics.HandshakeFailureReason) {
		t.Helper()
		select {
		case f := <-events:
			if f.Reason != reason || f.Backend != "yamux" || f.ByPeer {
				t.Errorf("%s: got reason %q backend %q by_peer %v (err %v), want %q", name, f.Reason, f.Backend, f.ByPeer, f.Err, reason)
			}
		case <-ctx.Done():
			t.Fatalf("%s: no OnHandshakeFailure call", name)
		}
	}
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := dial()
	_, _ = c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	want("not TLS", semantics.HandshakeProtocol)
	c.Close()

	dial().Close()
	want("closed at once", semantics.HandshakeProtocol)

	c = dial() // says nothing
	want("silent", semantics.HandshakeTimeout)
	c.Close()

	// A valid TLS client (ALPN http/1.1) that sends a bad Upgrade request.
	cfg := pki.ClientConfig(t, wire.NewRunnerId(), "localhost")
	cfg.NextProtos = []string{ALPNHTTP1}
	tc := tls.Client(dial(), cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		t.Fatal(err)
	}
	_, _ = tc.Write([]byte("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"))
	want("bad upgrade", semantics.HandshakeProtocol)
	tc.Close()
}
