package backendtest

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// HandshakeFailureFactory builds a backend's listener with an
// OnHandshakeFailure hook, for RunHandshakeFailures.
type HandshakeFailureFactory struct {
	// Name is the backend name the hook must report.
	Name string
	// Listen starts a listener using serverTLS (as Factory.Listen) that
	// calls hook for every failed handshake, and returns it plus the address
	// to dial. RunHandshakeFailures closes it when the test ends.
	Listen func(t testing.TB, serverTLS *tls.Config, hook func(semantics.HandshakeFailure)) (semantics.BackendListener, string)
	// Dialer returns a dialer using clientTLS (as Factory.Dialer).
	Dialer func(t testing.TB, clientTLS *tls.Config) semantics.BackendDialer
}

// RunHandshakeFailures checks a listener's OnHandshakeFailure hook on real
// handshakes: a client certificate from another CA, an expired one, one not
// yet valid, none at all, and a client that itself rejects the server's
// certificate each produce exactly one call with the right reason, backend,
// loopback remote address and (when the client sent one) the rejected
// certificate; a valid client produces none.
func RunHandshakeFailures(t *testing.T, f HandshakeFailureFactory) {
	pki := trusttest.NewPKI(t)
	other := trusttest.NewPKI(t)
	events := make(chan semantics.HandshakeFailure, 64)
	ln, addr := f.Listen(t, pki.ServerConfig(t, ServerName), func(hf semantics.HandshakeFailure) {
		select {
		case events <- hf:
		default:
			t.Errorf("OnHandshakeFailure: event queue full, dropped %+v", hf)
		}
	})
	t.Cleanup(func() { _ = ln.Close() })
	ctx := testCtx(t)

	// A valid client first: accepted, closed, never reported.
	acc := make(chan semantics.BackendConn, 1)
	go func() {
		c, err := ln.Accept(ctx)
		if err != nil {
			t.Errorf("Accept: %v", err)
			close(acc)
			return
		}
		acc <- c
	}()
	good, err := f.Dialer(t, pki.ClientConfig(t, wire.NewRunnerId(), ServerName)).Dial(ctx, addr)
	if err != nil {
		t.Fatalf("valid client: Dial: %v", err)
	}
	goodPort := portOf(good.LocalAddr())
	srv, ok := <-acc
	if !ok {
		t.FailNow()
	}
	_ = good.CloseWithCode(wire.CloseNormal, "")
	_ = srv.CloseWithCode(wire.CloseNormal, "")
	<-srv.Context().Done()

	now := time.Now()
	foreign := other.ClientConfig(t, wire.NewRunnerId(), ServerName)
	foreign.RootCAs = pki.CAPool() // trusts the server: the server rejects it
	notYet := pki.ClientConfigWith(t, pki.IssueClient(t, wire.NewRunnerId(),
		trusttest.LeafOptions{NotBefore: now.Add(time.Hour), NotAfter: now.Add(48 * time.Hour)}), ServerName)
	distrust := pki.ClientConfig(t, wire.NewRunnerId(), ServerName)
	distrust.RootCAs = other.CAPool() // rejects the server's certificate itself
	cases := []struct {
		name     string
		client   *tls.Config
		reason   semantics.HandshakeFailureReason
		byPeer   bool
		withCert bool
	}{
		{"ForeignCA", foreign, semantics.HandshakeUnknownAuthority, false, true},
		{"Expired", pki.ExpiredClientConfig(t, wire.NewRunnerId(), ServerName), semantics.HandshakeCertificateExpired, false, true},
		{"NotYetValid", notYet, semantics.HandshakeCertificateNotYetValid, false, true},
		{"NoCertificate", pki.NoClientCertConfig(t, ServerName), semantics.HandshakeNoClientCertificate, false, false},
		// crypto/tls clients send bad_certificate for any server chain
		// they do not accept.
		{"ClientDistrustsServer", distrust, semantics.HandshakeBadCertificate, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := f.Dialer(t, tc.client).Dial(ctx, addr)
			if err == nil { // TLS 1.3 over TCP: the client learns of its rejection later
				select {
				case <-c.Context().Done():
				case <-ctx.Done():
					t.Fatal("a rejected client's connection stayed up")
				}
				_ = c.CloseWithCode(wire.CloseNormal, "")
			}
			var hf semantics.HandshakeFailure
			select {
			case hf = <-events:
			case <-ctx.Done():
				t.Fatalf("no OnHandshakeFailure call for a rejected handshake")
			}
			t.Logf("hook: backend=%s remote=%v reason=%s by_peer=%v err=%v", hf.Backend, hf.Remote, hf.Reason, hf.ByPeer, hf.Err)
			if hf.Reason != tc.reason || hf.ByPeer != tc.byPeer {
				t.Errorf("reason %q by_peer %v, want %q by_peer %v (err %v)", hf.Reason, hf.ByPeer, tc.reason, tc.byPeer, hf.Err)
			}
			if hf.Backend != f.Name {
				t.Errorf("backend %q, want %q", hf.Backend, f.Name)
			}
			if hf.Err == nil {
				t.Error("Err is nil")
			}
			if ip := ipOf(hf.Remote); ip == nil || !ip.IsLoopback() || portOf(hf.Remote) == 0 {
				t.Errorf("remote %v, want a loopback address with a port", hf.Remote)
			} else if portOf(hf.Remote) == goodPort {
				t.Errorf("remote %v is the valid client's address", hf.Remote)
			}
			switch {
			case tc.withCert && hf.Certificate == nil:
				t.Error("Certificate is nil, want the rejected client certificate")
			case tc.withCert && tc.client.Certificates[0].Leaf.SerialNumber.Cmp(hf.Certificate.SerialNumber) != 0:
				t.Errorf("Certificate serial %v is not the client's", hf.Certificate.SerialNumber)
			case !tc.withCert && hf.Certificate != nil:
				t.Errorf("Certificate %v, want nil", hf.Certificate.Subject)
			}
		})
	}
	// Exactly one call per rejected handshake, none for the valid client.
	select {
	case hf := <-events:
		t.Errorf("extra OnHandshakeFailure call: %+v", hf)
	default:
	}
}

func ipOf(a net.Addr) net.IP {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.IP
	case *net.TCPAddr:
		return a.IP
	}
	return nil
}

func portOf(a net.Addr) int {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.Port
	case *net.TCPAddr:
		return a.Port
	}
	return 0
}
