package webtransport

import (
	"crypto/tls"
	"testing"

	"forgeyard.dev/transport/backends/backendtest"
	fyquic "forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/semantics"
)

// testConfig keeps tests fast: short handshake timeout, defaults otherwise.
var testConfig = Config{HandshakeTimeout: 5e9}

func factory() backendtest.Factory { return factoryWith("webtransport", testConfig) }

// factoryWith is factory with another Config.
func factoryWith(name string, cfg Config) backendtest.Factory {
	return backendtest.Factory{
		Name: name,
		Listen: func(t testing.TB, serverTLS *tls.Config, lim semantics.Limits) (semantics.BackendListener, string) {
			cfg := cfg
			cfg.Limits = lim
			t.Helper()
			ln, err := Listen("127.0.0.1:0", serverTLS, cfg)
			if err != nil {
				t.Fatalf("webtransport.Listen: %v", err)
			}
			t.Cleanup(func() { _ = ln.Close() })
			return ln, URL(ln.Addr().String())
		},
		Dialer: func(t testing.TB, clientTLS *tls.Config, lim semantics.Limits) semantics.BackendDialer {
			cfg := cfg
			cfg.Limits = lim
			return Dialer{TLS: clientTLS, Config: cfg}
		},
		Caps: backendtest.Caps{RealNetwork: true},
	}
}

func TestConformance(t *testing.T) { backendtest.Run(t, factory()) }

func BenchmarkBackend(b *testing.B) { backendtest.RunBenchmarks(b, factory()) }

// BenchmarkBackendDelayHint is BenchmarkBackend with the DelayHint on
// (Config.DelayHintMaxRTT; compare its ours/* with BenchmarkBackend's).
func BenchmarkBackendDelayHint(b *testing.B) {
	cfg := testConfig
	cfg.DelayHintMaxRTT = fyquic.RecommendedDelayHintMaxRTT
	backendtest.RunBenchmarks(b, factoryWith("webtransport-delayhint", cfg))
}
