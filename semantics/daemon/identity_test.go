package daemon_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"testing"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// TestRegistrationIdentity: over a connection without TLS (what a relay
// hands the daemon through ServeConn) the registration is proven by the
// certificate chain (verified against RunnerCAs) and the key proof. A
// relay that has the runner's certificate but not its key cannot register
// as the runner.
func TestRegistrationIdentity(t *testing.T) {
	w := enginetest.NewWorld(t, enginetest.MemoryBackend())
	id := w.NewIdentity()
	other := w.NewIdentity()
	foreign := trusttest.NewPKI(t)
	foreignCert := foreign.IssueClient(t, id.Runner, trusttest.LeafOptions{})
	strangerKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	signer := id.Cert.PrivateKey.(crypto.Signer)

	cases := []struct {
		name   string
		runner wire.RunnerId
		signer crypto.Signer
		chain  [][]byte
		ok     bool
	}{
		{"valid chain and proof", id.Runner, signer, id.Cert.Certificate, true},
		{"proof by another key (relay without the key)", id.Runner, strangerKey, id.Cert.Certificate, false},
		{"claims another runner", other.Runner, signer, id.Cert.Certificate, false},
		{"chain from a foreign CA", id.Runner, foreignCert.PrivateKey.(crypto.Signer), foreignCert.Certificate, false},
		{"no chain and no TLS", id.Runner, signer, nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			client, server := memory.Pipe(memory.Options{})
			go w.D.ServeConn(context.Background(), server)
			rc := enginetest.RawOn(t, client, id)
			rc.Hello(agentwire.RoleAgent)
			got := rc.RegisterWith(wire.NewAgentSessionId(), c.runner, c.signer, c.chain)
			if c.ok {
				if _, ok := got.(*agentwire.RegistrationAcceptedV1); !ok {
					t.Fatalf("rejected: %+v", got)
				}
				return
			}
			rej, ok := got.(*agentwire.RegistrationRejectedV1)
			if !ok || rej.Code != wire.ErrCodeForbidden || rej.Retry != wire.RetryNever {
				t.Fatalf("answer %+v", got)
			}
			if code := rc.CloseCode(); code != wire.CloseAuthenticationFailure {
				t.Fatalf("closed with %s", code)
			}
		})
	}
}

// TestChainMustMatchTLSLeaf: with mTLS, cert_chain[0] must be the TLS
// client certificate, even when the chain is otherwise valid.
func TestChainMustMatchTLSLeaf(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		second := w.Pki.IssueClient(t, id.Runner, trusttest.LeafOptions{}) // same runner, another key
		rc := w.DialRaw(id)                                                // TLS with id.cert
		rc.Hello(agentwire.RoleAgent)
		got := rc.RegisterWith(wire.NewAgentSessionId(), id.Runner, second.PrivateKey.(crypto.Signer), second.Certificate)
		if rej, ok := got.(*agentwire.RegistrationRejectedV1); !ok || rej.Code != wire.ErrCodeForbidden {
			t.Fatalf("answer %+v", got)
		}
		// Without cert_chain the TLS identity is used.
		rc2 := w.DialRaw(id)
		rc2.Hello(agentwire.RoleAgent)
		if got := rc2.RegisterWith(wire.NewAgentSessionId(), id.Runner, id.Cert.PrivateKey.(crypto.Signer), nil); !isAccepted(got) {
			t.Fatalf("TLS-only registration: %+v", got)
		}
	})
}

func isAccepted(m wire.Message) bool {
	_, ok := m.(*agentwire.RegistrationAcceptedV1)
	return ok
}
