package backendtest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"

	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

var netErrClosed = net.ErrClosed

func runTLS(t *testing.T, f Factory) {
	t.Run("Valid", func(t *testing.T) {
		e := newEnv(t, f)
		runner := wire.NewRunnerId()
		c, s := e.pairWith(t, e.clientTLS(t, runner))
		checkPeerCerts(t, c.ConnectionState(), s.ConnectionState(), runner)
		for _, st := range []tls.ConnectionState{c.ConnectionState(), s.ConnectionState()} {
			if st.Version != tls.VersionTLS13 || !st.HandshakeComplete {
				t.Fatalf("ConnectionState: Version %x HandshakeComplete %v, want TLS 1.3 complete", st.Version, st.HandshakeComplete)
			}
		}
	})
	t.Run("ExpiredClientCert", func(t *testing.T) {
		e := newEnv(t, f)
		e.wantRejected(t, e.pki.ExpiredClientConfig(t, wire.NewRunnerId(), ServerName))
	})
	t.Run("WrongCA", func(t *testing.T) {
		e := newEnv(t, f)
		other := trusttest.NewPKI(t)
		// A client of another PKI: its certificate is unknown to the server
		// and it does not trust the server's CA.
		e.wantRejected(t, other.ClientConfig(t, wire.NewRunnerId(), ServerName))
		// A client trusting the server's CA but with a certificate from another CA.
		foreign := other.ClientConfig(t, wire.NewRunnerId(), ServerName)
		foreign.RootCAs = e.pki.CAPool()
		e.wantRejected(t, foreign)
		// A client with a valid certificate that trusts only another CA.
		cfg := e.clientTLS(t, wire.NewRunnerId())
		cfg.RootCAs = other.CAPool()
		e.wantRejected(t, cfg)
	})
	t.Run("ServerNameMismatch", func(t *testing.T) {
		e := newEnv(t, f)
		e.wantRejected(t, e.pki.ClientConfig(t, wire.NewRunnerId(), "other.forgeyard.test"))
	})
	t.Run("MissingClientCert", func(t *testing.T) {
		e := newEnv(t, f)
		e.wantRejected(t, e.pki.NoClientCertConfig(t, ServerName))
	})
}

// wantRejected dials with a bad client configuration and checks that the
// connection fails: either Dial returns an error, or (TLS 1.3 over TCP,
// where a client learns of its rejection after its handshake returned) the
// connection dies promptly. The listener must never hand the connection to
// Accept: a valid client dialled afterwards is the first one accepted.
func (e *env) wantRejected(t *testing.T, bad *tls.Config) {
	t.Helper()
	ctx := testCtx(t)
	acc := e.startAccept(ctx)
	c, err := e.dialer(t, bad).Dial(ctx, e.addr)
	if err == nil {
		select {
		case <-c.Context().Done():
			t.Logf("rejected after dial: %v", context.Cause(c.Context()))
		case <-ctx.Done():
			t.Fatal("a rejected client's connection stayed up")
		}
		_ = c.CloseWithCode(wire.CloseNormal, "")
	} else {
		t.Logf("rejected at dial: %v", err)
	}
	runner := wire.NewRunnerId()
	good, err := e.dialer(t, e.clientTLS(t, runner)).Dial(ctx, e.addr)
	if err != nil {
		t.Fatalf("valid dial after a rejected one: %v", err)
	}
	defer good.CloseWithCode(wire.CloseNormal, "")
	r := <-acc
	if r.err != nil {
		t.Fatalf("Accept after a rejected dial: %v", r.err)
	}
	defer r.c.CloseWithCode(wire.CloseNormal, "")
	got, err := trust.RunnerIDFromCert(leaf(r.c.ConnectionState()))
	if err != nil || got != runner {
		t.Fatalf("first accepted connection is runner %v (%v), want the valid client %v: the rejected one was accepted", got, err, runner)
	}
}

func leaf(st tls.ConnectionState) *x509.Certificate {
	if len(st.PeerCertificates) == 0 {
		return nil
	}
	return st.PeerCertificates[0]
}

// checkPeerCerts: the server sees the agent certificate with its runner URI,
// verified; the client sees the server certificate valid for ServerName.
func checkPeerCerts(t testing.TB, client, server tls.ConnectionState, runner wire.RunnerId) {
	t.Helper()
	if len(server.PeerCertificates) == 0 || len(server.VerifiedChains) == 0 {
		t.Fatalf("server sees %d peer certificates, %d verified chains; want the agent's", len(server.PeerCertificates), len(server.VerifiedChains))
	}
	got, err := trust.RunnerIDFromCert(server.VerifiedChains[0][0])
	if err != nil || got != runner {
		t.Fatalf("server sees runner %v (%v), want %v", got, err, runner)
	}
	if len(client.PeerCertificates) == 0 {
		t.Fatal("client sees no server certificate")
	}
	if err := client.PeerCertificates[0].VerifyHostname(ServerName); err != nil {
		t.Fatalf("client sees a server certificate not valid for %s: %v", ServerName, err)
	}
}
