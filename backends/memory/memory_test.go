package memory_test

import (
	"crypto/tls"
	"testing"

	"forgeyard.dev/transport/backends/backendtest"
	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/semantics"
)

// factory returns a memory backend on its own Network with opts.
func factory(opts memory.Options) backendtest.Factory {
	n := memory.NewNetwork()
	return backendtest.Factory{
		Name: "memory",
		Listen: func(t testing.TB, serverTLS *tls.Config, _ semantics.Limits) (semantics.BackendListener, string) {
			l, err := n.Listen("", serverTLS)
			if err != nil {
				t.Fatal(err)
			}
			return l, l.Addr().String()
		},
		// The dialer's Options configure both ends of a pair.
		Dialer: func(t testing.TB, clientTLS *tls.Config, lim semantics.Limits) semantics.BackendDialer {
			o := opts
			o.Limits = lim
			return &memory.Dialer{Network: n, TLSConfig: clientTLS, Options: o}
		},
	}
}

func TestConformance(t *testing.T) {
	backendtest.Run(t, factory(memory.Options{}))
}

func BenchmarkBackend(b *testing.B) {
	backendtest.RunBenchmarks(b, factory(memory.Options{}))
}

func TestIdleConnMemory(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 100
	}
	heap, _ := backendtest.IdleConnMemory(t, factory(memory.Options{}), n)
	if heap <= 0 || heap > 256<<10 {
		t.Fatalf("heap per idle connection %.0f B: implausible or over 256 KiB", heap)
	}
}
