package agentsetup

import (
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"strings"
	"testing"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/webtransport"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/daemonsetup"
	"forgeyard.dev/transport/internal/setup/serversetup"
)

func TestDevCredentialsAndTLS(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	var stls config.ServerTLS
	if _, err := daemonsetup.DevDaemon(dir, &stls); err != nil {
		t.Fatal(err)
	}
	srv, err := serversetup.ServerTLS(stls)
	if err != nil {
		t.Fatal(err)
	}
	if srv.ClientCAs == nil || srv.ClientAuth == 0 {
		t.Error("server TLS does not verify client certificates")
	}
	if _, err := daemonsetup.RunnerCAs(stls.ClientCA); err != nil {
		t.Fatal(err)
	}
	var cp config.ControlPlane
	pki, err := DevAgent(dir, "a1", &cp)
	if err != nil {
		t.Fatal(err)
	}
	cred, err := LoadCredential(cp)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := pki.Agent("a1")
	if cred.Runner != a.Runner || len(cred.CertChain) == 0 {
		t.Errorf("runner %v, want %v", cred.Runner, a.Runner)
	}
	// The signer signs with the certificate's key.
	digest := sha256.Sum256([]byte("x"))
	sig, err := cred.Signer.Sign(rand.Reader, digest[:], cryptoSHA256)
	if err != nil {
		t.Fatal(err)
	}
	if err := cred.Leaf.CheckSignature(x509.ECDSAWithSHA256, []byte("x"), sig); err != nil {
		t.Errorf("signature does not verify with the leaf: %v", err)
	}
	// Wrong file: names the configuration key (not the Go field).
	cp.Credential.PrivateKey = stls.PrivateKey
	if _, err := LoadCredential(cp); err == nil || !strings.Contains(err.Error(), "control_plane.credential.private_key") || strings.Contains(err.Error(), "KeyFile") {
		t.Errorf("mismatched key: %v", err)
	}
}

func TestDialerPerBackend(t *testing.T) {
	for _, c := range []struct {
		uri  string
		want any
		addr string
	}{
		{"quic://h:1", quic.Dialer{}, "h:1"},
		{"yamux://h:2", yamux.Dialer{}, "h:2"},
		{"webtransport://h:3", webtransport.Dialer{}, webtransport.URL("h:3")},
	} {
		e, err := config.ParseEndpoint(c.uri)
		if err != nil {
			t.Fatal(err)
		}
		d, addr, err := Dialer(e, emptyTLS(), quic.Config{}, yamux.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if addr != c.addr {
			t.Errorf("%s: addr %q, want %q", c.uri, addr, c.addr)
		}
		switch c.want.(type) {
		case quic.Dialer:
			if dd, ok := d.(quic.Dialer); !ok || dd.TLS.ServerName != "h" {
				t.Errorf("%s: %T", c.uri, d)
			}
		case yamux.Dialer:
			if _, ok := d.(yamux.Dialer); !ok {
				t.Errorf("%s: %T", c.uri, d)
			}
		case webtransport.Dialer:
			if _, ok := d.(webtransport.Dialer); !ok {
				t.Errorf("%s: %T", c.uri, d)
			}
		}
	}
}

const cryptoSHA256 = crypto.SHA256

func emptyTLS() *tls.Config { return &tls.Config{} }
