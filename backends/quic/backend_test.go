package quic

import (
	"crypto/tls"
	"testing"

	"forgeyard.dev/transport/backends/backendtest"
	"forgeyard.dev/transport/semantics"
)

// testConfig keeps tests fast: short handshake timeout, defaults otherwise.
var testConfig = Config{HandshakeTimeout: 5e9}

func factory() backendtest.Factory {
	return backendtest.Factory{
		Name: "quic",
		Listen: func(t testing.TB, serverTLS *tls.Config, lim semantics.Limits) (semantics.BackendListener, string) {
			cfg := testConfig
			cfg.Limits = lim
			t.Helper()
			ln, err := Listen("127.0.0.1:0", serverTLS, cfg)
			if err != nil {
				t.Fatalf("quic.Listen: %v", err)
			}
			t.Cleanup(func() { _ = ln.Close() })
			return ln, ln.Addr().String()
		},
		Dialer: func(t testing.TB, clientTLS *tls.Config, lim semantics.Limits) semantics.BackendDialer {
			cfg := testConfig
			cfg.Limits = lim
			return Dialer{TLS: clientTLS, Config: cfg}
		},
		Caps: backendtest.Caps{RealNetwork: true},
	}
}

func TestConformance(t *testing.T) { backendtest.Run(t, factory()) }

func BenchmarkBackend(b *testing.B) { backendtest.RunBenchmarks(b, factory()) }
