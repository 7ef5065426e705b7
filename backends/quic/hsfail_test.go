package quic

import (
	"crypto/tls"
	"testing"

	"forgeyard.dev/transport/backends/backendtest"
	"forgeyard.dev/transport/semantics"
)

func TestHandshakeFailureHook(t *testing.T) {
	backendtest.RunHandshakeFailures(t, backendtest.HandshakeFailureFactory{
		Name: "quic",
		Listen: func(t testing.TB, serverTLS *tls.Config, hook func(semantics.HandshakeFailure)) (semantics.BackendListener, string) {
			cfg := testConfig
			cfg.OnHandshakeFailure = hook
			ln, err := Listen("127.0.0.1:0", serverTLS, cfg)
			if err != nil {
				t.Fatalf("quic.Listen: %v", err)
			}
			return ln, ln.Addr().String()
		},
		Dialer: func(t testing.TB, clientTLS *tls.Config) semantics.BackendDialer {
			return Dialer{TLS: clientTLS, Config: testConfig}
		},
	})
}
