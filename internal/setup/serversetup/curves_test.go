package serversetup

import (
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// TestServerTLSCurves: tls.curves = ["x25519"] makes the daemon's real
// handshakes use X25519 (the agent offering the default hybrid first gets
// X25519 too, without a HelloRetryRequest failure); the default keeps the
// post-quantum hybrid; an unknown group is refused naming the key.
func TestServerTLSCurves(t *testing.T) {
	pki := trusttest.NewPKI(t)
	dir := t.TempDir()
	c := config.ServerTLS{Certificate: filepath.Join(dir, "server.pem"), PrivateKey: filepath.Join(dir, "server-key.pem"), ClientCA: filepath.Join(dir, "ca.pem")}
	writeServerPair(t, c.Certificate, c.PrivateKey, pki.IssueServer(t, "localhost", trusttest.LeafOptions{}))
	if err := os.WriteFile(c.ClientCA, pki.CACertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	client := func(curves ...tls.CurveID) *tls.Config {
		cc := pki.ClientConfig(t, wire.NewRunnerId(), "localhost")
		cc.CurvePreferences = curves
		return cc
	}
	for _, tc := range []struct {
		name   string
		server []string
		client *tls.Config
		want   tls.CurveID
	}{
		{"default", nil, client(), tls.X25519MLKEM768},
		{"x25519 both", config.CurvesX25519Only, client(tls.X25519), tls.X25519},
		{"x25519 daemon, default agent", config.CurvesX25519Only, client(), tls.X25519},
	} {
		c.Curves = tc.server
		srv, err := ServerTLS(c)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		r := trusttest.Handshake(t, srv, tc.client)
		if !r.OK() {
			t.Fatalf("%s: server %v, client %v", tc.name, r.ServerErr, r.ClientErr)
		}
		if got := r.ServerState.CurveID; got != tc.want {
			t.Errorf("%s: negotiated %v, want %v", tc.name, got, tc.want)
		}
	}
	// tls.disable_session_tickets: no ticket is issued.
	c.Curves, c.DisableSessionTickets = nil, true
	srv, err := ServerTLS(c)
	if err != nil || !srv.SessionTicketsDisabled {
		t.Fatalf("disable_session_tickets: SessionTicketsDisabled %v, %v", srv != nil && srv.SessionTicketsDisabled, err)
	}
	c.DisableSessionTickets = false
	c.Curves = []string{"x25519", "curve448"}
	_, err = ServerTLS(c)
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Key != "tls.curves[1]" || !strings.Contains(err.Error(), "x25519mlkem768") {
		t.Fatalf("unknown group: %v", err)
	}
}
