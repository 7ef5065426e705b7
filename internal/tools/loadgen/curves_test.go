package loadgen

import (
	"crypto/tls"
	"path/filepath"
	"slices"
	"testing"

	"forgeyard.dev/transport/internal/config"
)

// TestCurves: --curves reaches the fleet's TLS and the daemon
// configuration the loadgen writes (which the daemon's loader accepts);
// an unknown name is refused.
func TestCurves(t *testing.T) {
	dir := t.TempDir()
	p, err := PreparePKI(filepath.Join(dir, "pki"), 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SetCurves([]string{"x25519"}); err != nil {
		t.Fatal(err)
	}
	if got := p.ClientTLS(0).CurvePreferences; !slices.Equal(got, []tls.CurveID{tls.X25519}) {
		t.Fatalf("client curves %v", got)
	}
	path, err := WriteDaemonConfig(dir, p, 0, map[string]string{"quic": "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	d, err := config.LoadDaemon(path)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.TLS.Curves, []string{"x25519"}) {
		t.Fatalf("daemon tls.curves %v", d.TLS.Curves)
	}
	if err := p.SetCurves([]string{"x448"}); err == nil {
		t.Fatal("x448 accepted")
	}
}
