package trust_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

func TestEnrollmentToken(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 64; i++ {
		tok, err := trust.NewEnrollmentToken()
		if err != nil {
			t.Fatal(err)
		}
		if len(tok) != trust.EnrollmentTokenLen || !strings.HasPrefix(tok, trust.EnrollmentTokenPrefix) {
			t.Fatalf("token %q: wrong shape", tok)
		}
		if err := trust.CheckEnrollmentToken(tok); err != nil {
			t.Fatalf("CheckEnrollmentToken(%q) = %v", tok, err)
		}
		if seen[tok] {
			t.Fatal("duplicate token")
		}
		seen[tok] = true
		if trust.HashEnrollmentToken(tok) == trust.HashEnrollmentToken(tok+"x") {
			t.Fatal("hash ignores input")
		}
		if id := trust.EnrollmentTokenID(tok); len(id) != 12 || strings.Contains(tok, id) {
			t.Fatalf("token id %q", id)
		}
	}
	for _, bad := range []string{"", "fyet_", "fyet_" + strings.Repeat("A", 51), "xxxx_" + strings.Repeat("A", 52), "fyet_" + strings.Repeat("1", 52)} {
		if err := trust.CheckEnrollmentToken(bad); !errors.Is(err, trust.ErrBadEnrollmentToken) {
			t.Errorf("CheckEnrollmentToken(%q) = %v, want ErrBadEnrollmentToken", bad, err)
		}
	}
}

// TestCSRCarriesNoPrivateKey: the request the agent sends holds its public
// key and a signature, never the private scalar.
func TestCSRCarriesNoPrivateKey(t *testing.T) {
	key, err := trust.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := trust.CreateCSR(key, "runner-a")
	if err != nil {
		t.Fatal(err)
	}
	priv := key.(*ecdsa.PrivateKey)
	d, err := priv.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(csr, d) {
		t.Fatal("CSR contains the private key")
	}
	parsed, err := trust.ParseCSR(csr)
	if err != nil {
		t.Fatal(err)
	}
	if !priv.PublicKey.Equal(parsed.PublicKey) {
		t.Fatal("CSR public key differs")
	}
}

func TestParseCSRRejects(t *testing.T) {
	key, _ := trust.GenerateKey()
	good, _ := trust.CreateCSR(key, "x")
	tampered := bytes.Clone(good)
	tampered[len(tampered)-5] ^= 0xff
	if _, err := trust.ParseCSR(tampered); !errors.Is(err, trust.ErrBadCSR) {
		t.Errorf("tampered CSR: %v, want ErrBadCSR", err)
	}
	if _, err := trust.ParseCSR(nil); !errors.Is(err, trust.ErrBadCSR) {
		t.Errorf("empty CSR: %v", err)
	}
	if _, err := trust.ParseCSR(make([]byte, trust.MaxCSRSize+1)); !errors.Is(err, trust.ErrBadCSR) {
		t.Errorf("huge CSR: %v", err)
	}
	if _, err := trust.ParseCSR([]byte("garbage")); !errors.Is(err, trust.ErrBadCSR) {
		t.Errorf("garbage CSR: %v", err)
	}
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	rsaCSR, _ := trust.CreateCSR(rk, "x")
	if _, err := trust.ParseCSR(rsaCSR); !errors.Is(err, trust.ErrCSRKeyType) {
		t.Errorf("RSA CSR: %v, want ErrCSRKeyType", err)
	}
	_, ek, _ := ed25519.GenerateKey(rand.Reader)
	edCSR, _ := trust.CreateCSR(ek, "x")
	if _, err := trust.ParseCSR(edCSR); err != nil {
		t.Errorf("Ed25519 CSR: %v", err)
	}
}

func TestIssuerIssues(t *testing.T) {
	pki := trusttest.NewPKI(t)
	is := pki.Issuer(time.Hour)
	key, _ := trust.GenerateKey()
	der, _ := trust.CreateCSR(key, "ignored-cn")
	csr, err := trust.ParseCSR(der)
	if err != nil {
		t.Fatal(err)
	}
	runner := wire.NewRunnerId()
	chain, leaf, err := is.Issue(csr, runner, "forgeyard runner build-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pki.CAPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("issued leaf does not verify: %v", err)
	}
	if id, err := trust.RunnerIDFromCert(leaf); err != nil || id != runner {
		t.Fatalf("runner = %v, %v; want %v", id, err, runner)
	}
	if got := leaf.NotAfter.Sub(leaf.NotBefore); got != time.Hour+trust.DevBackdate {
		t.Errorf("validity %v", got)
	}
	if len(chain) != 1 || !bytes.Equal(chain[0], leaf.Raw) || trust.SerialString(leaf) == "" {
		t.Errorf("chain %d entries, serial %q", len(chain), trust.SerialString(leaf))
	}
	// A real mTLS handshake with the issued certificate succeeds.
	cert := tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: leaf}
	res := trusttest.Handshake(t, pki.ServerConfig(t, "localhost"), pki.ClientConfigWith(t, cert, "localhost"))
	if !res.OK() {
		t.Fatalf("handshake: server %v client %v", res.ServerErr, res.ClientErr)
	}
	id, err := trust.VerifyPeer(res.ServerState, time.Now())
	if err != nil || id.Runner != runner {
		t.Fatalf("VerifyPeer = %v, %v", id, err)
	}
	// A leaf is no issuer.
	bad := &trust.Issuer{CA: leaf, Key: key}
	if _, _, err := bad.Issue(csr, runner, "x"); !errors.Is(err, trust.ErrIssuerNotCA) {
		t.Errorf("leaf as issuer: %v", err)
	}
}

func TestRenewAt(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := &x509.Certificate{NotBefore: nb, NotAfter: nb.Add(90 * time.Hour)}
	if got := trust.RenewAt(c, time.Minute); !got.Equal(nb.Add(60 * time.Hour)) {
		t.Errorf("2/3: %v", got)
	}
	if got := trust.RenewAt(c, 40*time.Hour); !got.Equal(nb.Add(50 * time.Hour)) {
		t.Errorf("window: %v", got)
	}
	// A window longer than half the lifetime is ignored.
	if got := trust.RenewAt(c, 14*24*time.Hour); !got.Equal(nb.Add(60 * time.Hour)) {
		t.Errorf("long window: %v", got)
	}
}

// issueFiles writes an issued agent credential to dir and returns the paths.
func issueFiles(t *testing.T, is *trust.Issuer, dir string, runner wire.RunnerId) (string, string) {
	t.Helper()
	key, _ := trust.GenerateKey()
	der, _ := trust.CreateCSR(key, "a")
	csr, _ := trust.ParseCSR(der)
	chain, _, err := is.Issue(csr, runner, "a")
	if err != nil {
		t.Fatal(err)
	}
	cf, kf := filepath.Join(dir, "agent.pem"), filepath.Join(dir, "agent-key.pem")
	if err := trust.WriteCredentialFiles(cf, kf, chain, key); err != nil {
		t.Fatal(err)
	}
	return cf, kf
}

func renewed(t *testing.T, is *trust.Issuer, runner wire.RunnerId) ([][]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, _ := trust.GenerateKey()
	der, _ := trust.CreateCSR(key, "a")
	csr, _ := trust.ParseCSR(der)
	chain, _, err := is.Issue(csr, runner, "a")
	if err != nil {
		t.Fatal(err)
	}
	return chain, key.(*ecdsa.PrivateKey)
}

// TestCredentialsRotate: Update swaps files and memory atomically; a dialer
// built once with ClientConfigFor presents the new certificate on its next
// handshake; another runner's certificate is refused.
func TestCredentialsRotate(t *testing.T) {
	pki := trusttest.NewPKI(t)
	is := pki.Issuer(time.Hour)
	dir := t.TempDir()
	runner := wire.NewRunnerId()
	cf, kf := issueFiles(t, is, dir, runner)
	creds, err := trust.LoadCredentials(cf, kf)
	if err != nil {
		t.Fatal(err)
	}
	base, err := trust.ClientConfig(trust.ClientFiles{})
	if err != nil {
		t.Fatal(err)
	}
	base.RootCAs = pki.CAPool()
	base.ServerName = "localhost"
	cli := creds.ClientConfigFor(base)
	srv := pki.ServerConfig(t, "localhost")
	oldSerial := trust.SerialString(creds.Leaf())

	chain, key := renewed(t, is, runner)
	if err := creds.Update(chain, key); err != nil {
		t.Fatal(err)
	}
	res := trusttest.Handshake(t, srv, cli)
	if !res.OK() {
		t.Fatalf("handshake: %v / %v", res.ServerErr, res.ClientErr)
	}
	if got := trust.SerialString(res.ServerState.VerifiedChains[0][0]); got == oldSerial || got != trust.SerialString(creds.Leaf()) {
		t.Fatalf("server saw serial %s; old %s new %s", got, oldSerial, trust.SerialString(creds.Leaf()))
	}
	// The files hold the new pair; no temporary files are left.
	again, err := trust.LoadCredentials(cf, kf)
	if err != nil || trust.SerialString(again.Leaf()) != trust.SerialString(creds.Leaf()) {
		t.Fatalf("reloaded: %v", err)
	}
	if st, _ := os.Stat(kf); st.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v", st.Mode().Perm())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Errorf("directory holds %d entries, want 2", len(ents))
	}
	// Another runner's certificate is never accepted as a renewal.
	other, okey := renewed(t, is, wire.NewRunnerId())
	if err := creds.Update(other, okey); err == nil {
		t.Fatal("Update accepted another runner's certificate")
	}
	// Mismatched key.
	if err := creds.Update(chain, okey); !errors.Is(err, trust.ErrKeyMismatch) {
		t.Fatalf("mismatched key: %v", err)
	}
}

// TestCredentialsInterruptedUpdate: a crash after the key was replaced but
// before the certificate was is completed by the next load.
func TestCredentialsInterruptedUpdate(t *testing.T) {
	pki := trusttest.NewPKI(t)
	is := pki.Issuer(time.Hour)
	dir := t.TempDir()
	runner := wire.NewRunnerId()
	cf, kf := issueFiles(t, is, dir, runner)
	chain, key := renewed(t, is, runner)
	// Simulate: write the new pair to other paths, then move only the key
	// and the ".next" certificate into place.
	tmpC, tmpK := filepath.Join(dir, "n.pem"), filepath.Join(dir, "n-key.pem")
	if err := trust.WriteCredentialFiles(tmpC, tmpK, chain, key); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmpK, kf); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmpC, cf+".next"); err != nil {
		t.Fatal(err)
	}
	creds, err := trust.LoadCredentials(cf, kf)
	if err != nil {
		t.Fatalf("load after interrupted update: %v", err)
	}
	if !bytes.Equal(creds.Leaf().Raw, chain[0]) {
		t.Fatal("not the renewed certificate")
	}
	if _, err := os.Stat(cf + ".next"); !errors.Is(err, os.ErrNotExist) {
		t.Fatal(".next left behind")
	}
}

func TestExplainHandshakeError(t *testing.T) {
	now := time.Now()
	exp := &x509.Certificate{NotAfter: now.Add(-time.Hour)}
	if got := trust.ExplainHandshakeError(errors.New("remote error: tls: bad certificate"), exp, now); !strings.HasPrefix(got, trust.MsgCredentialExpired) {
		t.Errorf("local expiry: %q", got)
	}
	if got := trust.ExplainHandshakeError(errors.New("CRYPTO_ERROR 0x12d (remote): tls: expired certificate"), nil, now); !strings.HasPrefix(got, trust.MsgCredentialExpired) {
		t.Errorf("remote expiry: %q", got)
	}
	if got := trust.ExplainHandshakeError(errors.New("remote error: tls: certificate required"), nil, now); !strings.Contains(got, "enroll") {
		t.Errorf("no cert: %q", got)
	}
	// A real handshake with an expired certificate: the daemon's alert is
	// explained as an expiry.
	pki := trusttest.NewPKI(t)
	res := trusttest.Handshake(t, pki.ServerConfig(t, "localhost"), pki.ExpiredClientConfig(t, wire.NewRunnerId(), "localhost"))
	if res.OK() {
		t.Fatal("expired certificate accepted")
	}
	if got := trust.ExplainHandshakeError(res.ClientErr, nil, now); !strings.HasPrefix(got, trust.MsgCredentialExpired) {
		t.Errorf("real expired handshake: %q (client error %v)", got, res.ClientErr)
	}
}

// TestServerCredentialsReload: a listener built once with ServerConfigFor
// serves the replaced certificate after Reload, without a restart.
func TestServerCredentialsReload(t *testing.T) {
	pki := trusttest.NewPKI(t)
	dir := t.TempDir()
	cf, kf := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	write := func() string {
		c := pki.IssueServer(t, "localhost", trusttest.LeafOptions{})
		if err := trust.WriteCredentialFiles(cf, kf, c.Certificate, c.PrivateKey.(*ecdsa.PrivateKey)); err != nil {
			t.Fatal(err)
		}
		return trust.SerialString(c.Leaf)
	}
	first := write()
	creds, err := trust.LoadServerCredentials(cf, kf)
	if err != nil {
		t.Fatal(err)
	}
	srv := creds.ServerConfigFor(pki.ServerConfig(t, "localhost"))
	cli := pki.ClientConfig(t, wire.NewRunnerId(), "localhost")
	serial := func() string {
		res := trusttest.Handshake(t, srv, cli)
		if !res.OK() {
			t.Fatalf("handshake: %v / %v", res.ServerErr, res.ClientErr)
		}
		return trust.SerialString(res.ClientState.PeerCertificates[0])
	}
	if got := serial(); got != first {
		t.Fatalf("served %s, want %s", got, first)
	}
	second := write()
	if got := serial(); got != first {
		t.Fatal("certificate changed before Reload")
	}
	if err := creds.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := serial(); got != second {
		t.Fatalf("after Reload served %s, want %s", got, second)
	}
}
