package trust_test

import (
	"bytes"
	"crypto"
	"testing"

	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// TestSessionCacheFollowsRenewal (issue 25 item 4): an agent's
// reconnection resumes its TLS session; after its certificate is renewed
// (Credentials.Update) the next connection is a full handshake presenting
// the new certificate, not a resumption carrying the old identity; and
// two agents' configurations never share a cache.
func TestSessionCacheFollowsRenewal(t *testing.T) {
	pki := trusttest.NewPKI(t)
	srv := pki.ServerConfig(t, "localhost")
	runner := wire.NewRunnerId()
	creds, err := trust.NewCredentials(pki.IssueClient(t, runner, trusttest.LeafOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	base := pki.NoClientCertConfig(t, "localhost")
	base.ClientSessionCache = trust.NewSessionCache(nil) // "resumption wanted"; ClientConfigFor binds its own
	cli := creds.ClientConfigFor(base)
	if cli.ClientSessionCache == base.ClientSessionCache {
		t.Fatal("ClientConfigFor kept the base's cache instead of one bound to the credentials")
	}
	hs := func(want bool) []byte {
		t.Helper()
		r := trusttest.Handshake(t, srv, cli.Clone()) // a dialer clones per dial
		if !r.OK() {
			t.Fatalf("handshake: server %v, client %v", r.ServerErr, r.ClientErr)
		}
		if r.ClientState.DidResume != want || r.ServerState.DidResume != want {
			t.Fatalf("DidResume agent %v server %v, want %v", r.ClientState.DidResume, r.ServerState.DidResume, want)
		}
		return r.ServerState.PeerCertificates[0].Raw
	}
	first := hs(false)
	if !bytes.Equal(hs(true), first) {
		t.Fatal("the resumed session carries another certificate")
	}
	// Another agent with its own config from the same base: no ticket.
	other, err := trust.NewCredentials(pki.IssueClient(t, wire.NewRunnerId(), trusttest.LeafOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	r := trusttest.Handshake(t, srv, other.ClientConfigFor(base))
	if !r.OK() || r.ClientState.DidResume {
		t.Fatalf("a second agent resumed the first one's session (%v %v)", r.ServerErr, r.ClientErr)
	}
	// Renewal: same runner, new certificate.
	renewed := pki.IssueClient(t, runner, trusttest.LeafOptions{})
	if err := creds.Update(renewed.Certificate, renewed.PrivateKey.(crypto.Signer)); err != nil {
		t.Fatal(err)
	}
	after := hs(false)
	if !bytes.Equal(after, renewed.Certificate[0]) || bytes.Equal(after, first) {
		t.Fatal("after the renewal the daemon did not see the new certificate")
	}
	hs(true) // and the new certificate's sessions resume
}
