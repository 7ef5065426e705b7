package trusttest_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"testing"

	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

func TestValidHandshakeBindsRunner(t *testing.T) {
	p := trusttest.NewPKI(t)
	runner := wire.NewRunnerId()
	r := trusttest.Handshake(t, p.ServerConfig(t, "daemon.test"), p.ClientConfig(t, runner, "daemon.test"))
	if !r.OK() {
		t.Fatalf("handshake failed: server=%v client=%v", r.ServerErr, r.ClientErr)
	}
	if r.ServerState.Version != tls.VersionTLS13 {
		t.Fatalf("version = %x, want TLS 1.3", r.ServerState.Version)
	}
	if len(r.ServerState.VerifiedChains) == 0 {
		t.Fatal("server has no verified client chain")
	}
	got, err := trust.RunnerIDFromCert(r.ServerState.VerifiedChains[0][0])
	if err != nil || got != runner {
		t.Fatalf("RunnerIDFromCert = %v, %v; want %v", got, err, runner)
	}
}

func TestLoopbackNames(t *testing.T) {
	p := trusttest.NewPKI(t)
	srv := p.ServerConfig(t, "daemon.test")
	for _, name := range []string{"daemon.test", "localhost", "127.0.0.1", "::1"} {
		r := trusttest.Handshake(t, srv, p.ClientConfig(t, wire.NewRunnerId(), name))
		if !r.OK() {
			t.Errorf("%s: server=%v client=%v", name, r.ServerErr, r.ClientErr)
		}
	}
}

func TestRejections(t *testing.T) {
	p := trusttest.NewPKI(t)
	other := trusttest.NewPKI(t)
	runner := wire.NewRunnerId()
	cases := []struct {
		name   string
		server *tls.Config
		client *tls.Config
	}{
		{"expired client", p.ServerConfig(t, "d"), p.ExpiredClientConfig(t, runner, "d")},
		{"no client cert", p.ServerConfig(t, "d"), p.NoClientCertConfig(t, "d")},
		{"client from other CA", p.ServerConfig(t, "d"), other.ClientConfig(t, runner, "d")},
		{"server from other CA", other.ServerConfig(t, "d"), p.ClientConfig(t, runner, "d")},
		{"server name mismatch", p.ServerConfig(t, "d"), p.ClientConfig(t, runner, "elsewhere.test")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := trusttest.Handshake(t, c.server, c.client)
			if r.ServerErr == nil || r.ClientErr == nil {
				t.Fatalf("want both sides to fail, got server=%v client=%v", r.ServerErr, r.ClientErr)
			}
		})
	}
}

func TestConfigsAreStrict(t *testing.T) {
	p := trusttest.NewPKI(t)
	r := wire.NewRunnerId()
	for name, c := range map[string]*tls.Config{
		"server":  p.ServerConfig(t, "d"),
		"client":  p.ClientConfig(t, r, "d"),
		"expired": p.ExpiredClientConfig(t, r, "d"),
		"nocert":  p.NoClientCertConfig(t, "d"),
	} {
		if c.MinVersion != tls.VersionTLS13 || c.InsecureSkipVerify || len(c.NextProtos) != 0 {
			t.Errorf("%s: MinVersion=%x InsecureSkipVerify=%v NextProtos=%v", name, c.MinVersion, c.InsecureSkipVerify, c.NextProtos)
		}
	}
	if s := p.ServerConfig(t, "d"); s.ClientAuth != tls.RequireAndVerifyClientCert || s.ClientCAs == nil {
		t.Errorf("server ClientAuth=%v ClientCAs=%v", s.ClientAuth, s.ClientCAs)
	}
}

func TestCAPEMMatchesPool(t *testing.T) {
	p := trusttest.NewPKI(t)
	blk, rest := pem.Decode(p.CACertPEM())
	if blk == nil || blk.Type != "CERTIFICATE" || len(rest) != 0 {
		t.Fatalf("CACertPEM is not a single CERTIFICATE block")
	}
	ca, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !ca.IsCA || !ca.Equal(p.CACert()) {
		t.Fatal("PEM CA differs from CACert")
	}
	leaf := p.IssueClient(t, wire.NewRunnerId(), trusttest.LeafOptions{}).Leaf
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: p.CAPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("client leaf does not verify against CAPool: %v", err)
	}
	// Mutating the returned PEM must not affect the PKI.
	b := p.CACertPEM()
	b[0] = 'X'
	if p.CACertPEM()[0] == 'X' {
		t.Fatal("CACertPEM aliases internal state")
	}
}
