package trust_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// writePair writes cert's chain and key as PEM files in dir and returns
// their paths.
func writePair(t *testing.T, dir, name string, cert tls.Certificate) (certPath, keyPath string) {
	t.Helper()
	var chain []byte
	for _, der := range cert.Certificate {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	writeFile(t, certPath, chain)
	writeFile(t, keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	return certPath, keyPath
}

func writeFile(t *testing.T, path string, b []byte) string {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

type fixture struct {
	p                   *trusttest.PKI
	runner              wire.RunnerId
	dir                 string
	ca                  string
	srvCert, srvKey     string
	agentCert, agentKey string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{p: trusttest.NewPKI(t), runner: wire.NewRunnerId(), dir: t.TempDir()}
	f.ca = writeFile(t, filepath.Join(f.dir, "ca.pem"), f.p.CACertPEM())
	f.srvCert, f.srvKey = writePair(t, f.dir, "server", f.p.IssueServer(t, "daemon.test", trusttest.LeafOptions{}))
	f.agentCert, f.agentKey = writePair(t, f.dir, "agent", f.p.IssueClient(t, f.runner, trusttest.LeafOptions{}))
	return f
}

func TestConfigFromFilesHandshake(t *testing.T) {
	f := newFixture(t)
	srv, err := trust.ServerConfig(trust.ServerFiles{CertFile: f.srvCert, KeyFile: f.srvKey, ClientCAFile: f.ca, RequireClientCert: true})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := trust.ClientConfig(trust.ClientFiles{CertFile: f.agentCert, KeyFile: f.agentKey, CAFile: f.ca, ServerName: "daemon.test"})
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*tls.Config{"server": srv, "client": cli} {
		if c.MinVersion != tls.VersionTLS13 || c.InsecureSkipVerify || c.MaxVersion != 0 && c.MaxVersion < tls.VersionTLS13 {
			t.Errorf("%s: MinVersion=%x MaxVersion=%x InsecureSkipVerify=%v", name, c.MinVersion, c.MaxVersion, c.InsecureSkipVerify)
		}
	}
	if srv.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Errorf("ClientAuth = %v", srv.ClientAuth)
	}
	r := trusttest.Handshake(t, srv, cli)
	if !r.OK() {
		t.Fatalf("handshake: server=%v client=%v", r.ServerErr, r.ClientErr)
	}
	id, err := trust.VerifyPeer(r.ServerState, time.Now())
	if err != nil || id.Runner != f.runner {
		t.Fatalf("VerifyPeer = %v, %v; want %v", id.Runner, err, f.runner)
	}
	// A client without a certificate is refused by that server.
	anon, err := trust.ClientConfig(trust.ClientFiles{CAFile: f.ca, ServerName: "daemon.test"})
	if err != nil {
		t.Fatal(err)
	}
	if r := trusttest.Handshake(t, srv, anon); r.ServerErr == nil {
		t.Fatal("server accepted a client without a certificate")
	}
}

func TestServerConfigClientAuthModes(t *testing.T) {
	f := newFixture(t)
	c, err := trust.ServerConfig(trust.ServerFiles{CertFile: f.srvCert, KeyFile: f.srvKey})
	if err != nil || c.ClientAuth != tls.NoClientCert {
		t.Fatalf("no CA: %v, %v", c, err)
	}
	c, err = trust.ServerConfig(trust.ServerFiles{CertFile: f.srvCert, KeyFile: f.srvKey, ClientCAFile: f.ca})
	if err != nil || c.ClientAuth != tls.VerifyClientCertIfGiven || c.ClientCAs == nil {
		t.Fatalf("CA, not required: %v, %v", c, err)
	}
	_, err = trust.ServerConfig(trust.ServerFiles{CertFile: f.srvCert, KeyFile: f.srvKey, RequireClientCert: true})
	if !errors.Is(err, trust.ErrFileNotConfigured) || !strings.Contains(err.Error(), "ClientCAFile") {
		t.Fatalf("required without CA: %v", err)
	}
}

// fileErr asserts err is a *FileError of kind naming field and path.
func fileErr(t *testing.T, err error, kind error, field, path string, mentions ...string) {
	t.Helper()
	var fe *trust.FileError
	if !errors.As(err, &fe) {
		t.Fatalf("err = %v (%T), want *FileError", err, err)
	}
	if !errors.Is(err, kind) || fe.Field != field || fe.Path != path {
		t.Fatalf("err = %v; want kind %v, field %s, path %s", err, kind, field, path)
	}
	msg := err.Error()
	for _, m := range append([]string{field, path}, mentions...) {
		if !strings.Contains(msg, m) {
			t.Errorf("message %q does not mention %q", msg, m)
		}
	}
}

func TestFileErrors(t *testing.T) {
	f := newFixture(t)
	dir := f.dir
	missing := filepath.Join(dir, "nope.pem")
	garbage := writeFile(t, filepath.Join(dir, "garbage.pem"), []byte("hello, not PEM\n"))
	encrypted := writeFile(t, filepath.Join(dir, "enc-key.pem"), pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{1, 2, 3}}))
	brokenCert := writeFile(t, filepath.Join(dir, "broken.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2, 3}}))
	huge := writeFile(t, filepath.Join(dir, "huge.pem"), make([]byte, 2<<20))
	now := time.Now()
	expCert, expKey := writePair(t, dir, "expired", f.p.IssueServer(t, "d", trusttest.LeafOptions{NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-time.Hour)}))
	futCert, futKey := writePair(t, dir, "future", f.p.IssueServer(t, "d", trusttest.LeafOptions{NotBefore: now.Add(time.Hour), NotAfter: now.Add(48 * time.Hour)}))

	t.Run("missing cert", func(t *testing.T) {
		_, err := trust.ServerConfig(trust.ServerFiles{CertFile: missing, KeyFile: f.srvKey})
		fileErr(t, err, trust.ErrFileMissing, "CertFile", missing, "does not exist")
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("does not unwrap to fs.ErrNotExist: %v", err)
		}
	})
	t.Run("empty path", func(t *testing.T) {
		_, err := trust.ServerConfig(trust.ServerFiles{KeyFile: f.srvKey})
		fileErr(t, err, trust.ErrFileNotConfigured, "CertFile", "")
	})
	t.Run("directory", func(t *testing.T) {
		_, err := trust.ServerConfig(trust.ServerFiles{CertFile: f.srvCert, KeyFile: dir})
		fileErr(t, err, trust.ErrFileUnreadable, "KeyFile", dir, "not a regular file")
	})
	t.Run("oversized", func(t *testing.T) {
		_, err := trust.ServerConfig(trust.ServerFiles{CertFile: huge, KeyFile: f.srvKey})
		fileErr(t, err, trust.ErrFileUnreadable, "CertFile", huge, "limit")
	})
	t.Run("not PEM", func(t *testing.T) {
		_, err := trust.ServerConfig(trust.ServerFiles{CertFile: garbage, KeyFile: f.srvKey})
		fileErr(t, err, trust.ErrNotPEM, "CertFile", garbage, "no PEM CERTIFICATE block")
	})
	t.Run("bad certificate DER", func(t *testing.T) {
		_, err := trust.ServerConfig(trust.ServerFiles{CertFile: brokenCert, KeyFile: f.srvKey})
		fileErr(t, err, trust.ErrNotPEM, "CertFile", brokenCert, "certificate 1")
	})
	t.Run("key given as cert", func(t *testing.T) {
		_, err := trust.ServerConfig(trust.ServerFiles{CertFile: f.srvKey, KeyFile: f.srvKey})
		fileErr(t, err, trust.ErrNotPEM, "CertFile", f.srvKey, "looks like a key file")
	})
	t.Run("cert given as key", func(t *testing.T) {
		_, err := trust.ServerConfig(trust.ServerFiles{CertFile: f.srvCert, KeyFile: f.srvCert})
		fileErr(t, err, trust.ErrNotPEM, "KeyFile", f.srvCert, "looks like a certificate")
	})
	t.Run("encrypted key", func(t *testing.T) {
		_, err := trust.ServerConfig(trust.ServerFiles{CertFile: f.srvCert, KeyFile: encrypted})
		fileErr(t, err, trust.ErrNotPEM, "KeyFile", encrypted, "encrypted")
	})
	t.Run("key mismatch", func(t *testing.T) {
		_, err := trust.ServerConfig(trust.ServerFiles{CertFile: f.srvCert, KeyFile: f.agentKey})
		fileErr(t, err, trust.ErrKeyMismatch, "KeyFile", f.agentKey, f.srvCert)
	})
	t.Run("expired", func(t *testing.T) {
		_, err := trust.ServerConfig(trust.ServerFiles{CertFile: expCert, KeyFile: expKey})
		fileErr(t, err, trust.ErrCertExpired, "CertFile", expCert, "expired at")
	})
	t.Run("not yet valid", func(t *testing.T) {
		_, err := trust.ServerConfig(trust.ServerFiles{CertFile: futCert, KeyFile: futKey})
		fileErr(t, err, trust.ErrCertNotYetValid, "CertFile", futCert, "clock")
	})
	t.Run("client cert as server cert", func(t *testing.T) {
		_, err := trust.ServerConfig(trust.ServerFiles{CertFile: f.agentCert, KeyFile: f.agentKey})
		fileErr(t, err, trust.ErrWrongKeyUsage, "CertFile", f.agentCert, "serverAuth")
	})
	t.Run("server cert as client cert", func(t *testing.T) {
		_, err := trust.ClientConfig(trust.ClientFiles{CertFile: f.srvCert, KeyFile: f.srvKey, CAFile: f.ca})
		fileErr(t, err, trust.ErrWrongKeyUsage, "CertFile", f.srvCert, "clientAuth")
	})
	t.Run("leaf as CA", func(t *testing.T) {
		_, err := trust.ClientConfig(trust.ClientFiles{CAFile: f.srvCert})
		fileErr(t, err, trust.ErrWrongKeyUsage, "CAFile", f.srvCert, "not a CA")
	})
	t.Run("missing CA", func(t *testing.T) {
		_, err := trust.ServerConfig(trust.ServerFiles{CertFile: f.srvCert, KeyFile: f.srvKey, ClientCAFile: missing, RequireClientCert: true})
		fileErr(t, err, trust.ErrFileMissing, "ClientCAFile", missing)
	})
	t.Run("half a client pair", func(t *testing.T) {
		_, err := trust.ClientConfig(trust.ClientFiles{CertFile: f.agentCert, CAFile: f.ca})
		fileErr(t, err, trust.ErrFileNotConfigured, "KeyFile", "", "without KeyFile")
		_, err = trust.ClientConfig(trust.ClientFiles{KeyFile: f.agentKey, CAFile: f.ca})
		fileErr(t, err, trust.ErrFileNotConfigured, "CertFile", "", "without CertFile")
	})
	t.Run("malformed runner URI in client cert", func(t *testing.T) {
		first := f.p.IssueClient(t, wire.NewRunnerId(), trusttest.LeafOptions{})
		two := f.p.IssueClient(t, wire.NewRunnerId(), trusttest.LeafOptions{URIs: first.Leaf.URIs})
		c, k := writePair(t, dir, "two", two)
		_, err := trust.ClientConfig(trust.ClientFiles{CertFile: c, KeyFile: k, CAFile: f.ca})
		fileErr(t, err, trust.ErrWrongKeyUsage, "CertFile", c)
		if !errors.Is(err, trust.ErrMultipleRunnerURIs) {
			t.Errorf("does not unwrap to ErrMultipleRunnerURIs: %v", err)
		}
	})
}

func TestKeyFormats(t *testing.T) {
	f := newFixture(t)
	cert := f.p.IssueServer(t, "d", trusttest.LeafOptions{})
	ecDER, err := x509.MarshalECPrivateKey(cert.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	certPath, _ := writePair(t, f.dir, "sec1", cert)
	keyPath := writeFile(t, filepath.Join(f.dir, "sec1-key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: ecDER}))
	if _, err := trust.ServerConfig(trust.ServerFiles{CertFile: certPath, KeyFile: keyPath}); err != nil {
		t.Fatalf("SEC 1 key: %v", err)
	}
	// A key of the right type but another value is a mismatch, not a parse error.
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	otherDER, _ := x509.MarshalPKCS8PrivateKey(other)
	wrong := writeFile(t, filepath.Join(f.dir, "wrong-key.pem"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: otherDER}))
	if _, err := trust.ServerConfig(trust.ServerFiles{CertFile: certPath, KeyFile: wrong}); !errors.Is(err, trust.ErrKeyMismatch) {
		t.Fatalf("wrong key: %v", err)
	}
}
