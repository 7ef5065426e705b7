package trust_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// These tests run real crypto/tls handshakes over loopback TCP, so the trust
// layer is proven independently of any backend.

func TestVerifyPeerValidChain(t *testing.T) {
	p := trusttest.NewPKI(t)
	runner := wire.NewRunnerId()
	cli := p.ClientConfig(t, runner, "daemon.test")
	r := trusttest.Handshake(t, p.ServerConfig(t, "daemon.test"), cli)
	if !r.OK() {
		t.Fatalf("handshake: server=%v client=%v", r.ServerErr, r.ClientErr)
	}
	id, err := trust.VerifyPeer(r.ServerState, time.Now())
	if err != nil {
		t.Fatalf("VerifyPeer: %v", err)
	}
	leaf := cli.Certificates[0].Leaf
	if id.Runner != runner {
		t.Errorf("Runner = %v, want %v", id.Runner, runner)
	}
	if !id.NotAfter.Equal(leaf.NotAfter) { // leaf expires before the CA
		t.Errorf("NotAfter = %v, want %v", id.NotAfter, leaf.NotAfter)
	}
	if id.Subject != leaf.Subject.String() {
		t.Errorf("Subject = %q, want %q", id.Subject, leaf.Subject.String())
	}
	// The same state, judged after the leaf expired, is rejected.
	if _, err := trust.VerifyPeer(r.ServerState, leaf.NotAfter.Add(time.Second)); !errors.Is(err, trust.ErrCertExpired) {
		t.Errorf("VerifyPeer after expiry: %v, want ErrCertExpired", err)
	}
	if _, err := trust.VerifyPeer(r.ServerState, leaf.NotBefore.Add(-time.Second)); !errors.Is(err, trust.ErrCertNotYetValid) {
		t.Errorf("VerifyPeer before validity: %v, want ErrCertNotYetValid", err)
	}
}

func TestVerifyPeerNotAfterIsChainMinimum(t *testing.T) {
	p := trusttest.NewPKI(t)
	runner := wire.NewRunnerId()
	// A leaf that outlives its CA: the identity ends with the CA.
	cert := p.IssueClient(t, runner, trusttest.LeafOptions{NotAfter: p.CACert().NotAfter.Add(time.Hour)})
	r := trusttest.Handshake(t, p.ServerConfig(t, "d"), p.ClientConfigWith(t, cert, "d"))
	if !r.OK() {
		t.Fatalf("handshake: server=%v client=%v", r.ServerErr, r.ClientErr)
	}
	id, err := trust.VerifyPeer(r.ServerState, time.Now())
	if err != nil || !id.NotAfter.Equal(p.CACert().NotAfter) {
		t.Fatalf("VerifyPeer = %+v, %v; want NotAfter %v", id, err, p.CACert().NotAfter)
	}
}

// The daemon rejects expired credentials (§22): crypto/tls refuses the
// handshake, and the client learns why.
func TestExpiredClientCertRejected(t *testing.T) {
	p := trusttest.NewPKI(t)
	r := trusttest.Handshake(t, p.ServerConfig(t, "d"), p.ExpiredClientConfig(t, wire.NewRunnerId(), "d"))
	var inv x509.CertificateInvalidError
	if !errors.As(r.ServerErr, &inv) || inv.Reason != x509.Expired {
		t.Fatalf("server err = %v, want x509 Expired", r.ServerErr)
	}
	if r.ClientErr == nil {
		t.Fatal("client did not learn of the rejection")
	}
}

func TestExpiredServerCertRejected(t *testing.T) {
	p := trusttest.NewPKI(t)
	now := time.Now()
	srv := p.ServerConfigWith(t, p.IssueServer(t, "d", trusttest.LeafOptions{NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-time.Hour)}))
	r := trusttest.Handshake(t, srv, p.ClientConfig(t, wire.NewRunnerId(), "d"))
	var inv x509.CertificateInvalidError
	if !errors.As(r.ClientErr, &inv) || inv.Reason != x509.Expired {
		t.Fatalf("client err = %v, want x509 Expired", r.ClientErr)
	}
	if r.ServerErr == nil {
		t.Fatal("server handshake succeeded")
	}
}

func TestWrongCARejected(t *testing.T) {
	p, other := trusttest.NewPKI(t), trusttest.NewPKI(t)
	t.Run("client cert from another CA", func(t *testing.T) {
		// The client trusts p, but presents a certificate from another CA.
		cli := p.NoClientCertConfig(t, "d")
		cli.Certificates = []tls.Certificate{other.IssueClient(t, wire.NewRunnerId(), trusttest.LeafOptions{})}
		r := trusttest.Handshake(t, p.ServerConfig(t, "d"), cli)
		var ua x509.UnknownAuthorityError
		if !errors.As(r.ServerErr, &ua) {
			t.Fatalf("server err = %v, want UnknownAuthorityError", r.ServerErr)
		}
		if r.ClientErr == nil {
			t.Fatal("client did not learn of the rejection")
		}
	})
	t.Run("server cert from another CA", func(t *testing.T) {
		r := trusttest.Handshake(t, other.ServerConfig(t, "d"), p.ClientConfig(t, wire.NewRunnerId(), "d"))
		var ua x509.UnknownAuthorityError
		if !errors.As(r.ClientErr, &ua) {
			t.Fatalf("client err = %v, want UnknownAuthorityError", r.ClientErr)
		}
		if r.ServerErr == nil {
			t.Fatal("server handshake succeeded")
		}
	})
}

func TestServerNameMismatchRejected(t *testing.T) {
	p := trusttest.NewPKI(t)
	r := trusttest.Handshake(t, p.ServerConfig(t, "daemon.test"), p.ClientConfig(t, wire.NewRunnerId(), "other.test"))
	var he x509.HostnameError
	if !errors.As(r.ClientErr, &he) {
		t.Fatalf("client err = %v, want HostnameError", r.ClientErr)
	}
	if r.ServerErr == nil {
		t.Fatal("server handshake succeeded")
	}
}

func TestMissingClientCertRejected(t *testing.T) {
	p := trusttest.NewPKI(t)
	r := trusttest.Handshake(t, p.ServerConfig(t, "d"), p.NoClientCertConfig(t, "d"))
	if r.ServerErr == nil || r.ClientErr == nil {
		t.Fatalf("want both sides to fail: server=%v client=%v", r.ServerErr, r.ClientErr)
	}
}

func TestVerifyPeerRejectsUnverified(t *testing.T) {
	p := trusttest.NewPKI(t)
	// A server that accepts any certificate without verifying it: the peer
	// certificate is present, but VerifyPeer must not trust it.
	srv := p.ServerConfig(t, "d")
	srv.ClientAuth = tls.RequireAnyClientCert
	other := trusttest.NewPKI(t)
	cli := p.NoClientCertConfig(t, "d")
	cli.Certificates = []tls.Certificate{other.IssueClient(t, wire.NewRunnerId(), trusttest.LeafOptions{})}
	r := trusttest.Handshake(t, srv, cli)
	if !r.OK() {
		t.Fatalf("handshake: server=%v client=%v", r.ServerErr, r.ClientErr)
	}
	if len(r.ServerState.PeerCertificates) == 0 {
		t.Fatal("test setup: no peer certificate")
	}
	if _, err := trust.VerifyPeer(r.ServerState, time.Now()); !errors.Is(err, trust.ErrNoVerifiedChain) {
		t.Fatalf("VerifyPeer = %v, want ErrNoVerifiedChain", err)
	}

	if _, err := trust.VerifyPeer(tls.ConnectionState{}, time.Now()); !errors.Is(err, trust.ErrHandshakeIncomplete) {
		t.Fatalf("incomplete: %v", err)
	}
	if _, err := trust.VerifyPeer(tls.ConnectionState{HandshakeComplete: true, VerifiedChains: [][]*x509.Certificate{{}}}, time.Now()); !errors.Is(err, trust.ErrNoVerifiedChain) {
		t.Fatalf("empty chain: %v", err)
	}
}

func TestVerifyPeerRequiresRunnerURI(t *testing.T) {
	p := trusttest.NewPKI(t)
	cert := p.IssueClient(t, wire.NewRunnerId(), trusttest.LeafOptions{OmitRunnerURI: true})
	r := trusttest.Handshake(t, p.ServerConfig(t, "d"), p.ClientConfigWith(t, cert, "d"))
	if !r.OK() {
		t.Fatalf("handshake: server=%v client=%v", r.ServerErr, r.ClientErr)
	}
	if _, err := trust.VerifyPeer(r.ServerState, time.Now()); !errors.Is(err, trust.ErrNoRunnerURI) {
		t.Fatalf("VerifyPeer = %v, want ErrNoRunnerURI", err)
	}
}
