package serversetup

import (
	"context"
	"crypto"
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
)

// servedSerial dials a real TLS listener on loopback and returns the
// serial of the certificate it presents (verified against the PKI).
func servedSerial(t *testing.T, addr string, pki *trusttest.PKI) string {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pki.CAPool(), ServerName: "localhost"})
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	defer c.Close()
	return trust.SerialString(c.ConnectionState().PeerCertificates[0])
}

func writeServerPair(t *testing.T, certFile, keyFile string, c tls.Certificate) string {
	t.Helper()
	if err := trust.WriteCredentialFiles(certFile, keyFile, c.Certificate, c.PrivateKey.(crypto.Signer)); err != nil {
		t.Fatal(err)
	}
	leaf := c.Leaf
	if leaf == nil {
		t.Fatal("issued certificate without Leaf")
	}
	return trust.SerialString(leaf)
}

// TestCertReloader: a listener built from CertReloader.TLSConfig serves a
// replaced certificate after the periodic check sees the files change and
// after SIGHUP, without a restart; broken files (garbage, a key that does
// not match) are reported and the previous certificate keeps being served.
func TestCertReloader(t *testing.T) {
	pki := trusttest.NewPKI(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	first := writeServerPair(t, certFile, keyFile, pki.IssueServer(t, "localhost", trusttest.LeafOptions{}))

	r, err := NewCertReloader(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", r.TLSConfig(&tls.Config{MinVersion: tls.VersionTLS13}))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _ = c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	addr := ln.Addr().String()
	if got := servedSerial(t, addr, pki); got != first {
		t.Fatalf("serves %s, want %s", got, first)
	}
	if tried, err := r.Check(); tried || err != nil {
		t.Fatalf("unchanged files: Check tried=%v err=%v", tried, err)
	}

	// Rotation by replacing the files; the periodic check picks it up.
	second := writeServerPair(t, certFile, keyFile, pki.IssueServer(t, "localhost", trusttest.LeafOptions{}))
	if tried, err := r.Check(); !tried || err != nil {
		t.Fatalf("replaced files: Check tried=%v err=%v", tried, err)
	}
	if got := servedSerial(t, addr, pki); got != second || r.Reloads() != 1 {
		t.Fatalf("after reload serves %s (reloads %d), want %s", got, r.Reloads(), second)
	}

	// A half-written certificate: reported, the current one stays.
	if err := os.WriteFile(certFile, []byte("-----BEGIN CERTIFICATE-----\ngarbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tried, err := r.Check(); !tried || err == nil {
		t.Fatalf("garbage file: Check tried=%v err=%v, want an error", tried, err)
	}
	if got := servedSerial(t, addr, pki); got != second {
		t.Fatalf("after a failed reload serves %s, want %s", got, second)
	}
	// A certificate whose key is another one's: refused the same way.
	other := pki.IssueServer(t, "localhost", trusttest.LeafOptions{})
	third := pki.IssueServer(t, "localhost", trusttest.LeafOptions{})
	writeServerPair(t, certFile, keyFile, other)
	if err := trust.WriteCredentialFiles(filepath.Join(dir, "x.pem"), keyFile, third.Certificate, third.PrivateKey.(crypto.Signer)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Check(); err == nil {
		t.Fatal("certificate and key that do not match: no error")
	}
	if got := servedSerial(t, addr, pki); got != second {
		t.Fatalf("after a mismatched pair serves %s, want %s", got, second)
	}

	// SIGHUP (the channel the command passes from signal.Notify).
	fourth := writeServerPair(t, certFile, keyFile, pki.IssueServer(t, "localhost", trusttest.LeafOptions{}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hup := make(chan os.Signal, 1)
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx, time.Hour, hup) }()
	hup <- nil
	deadline := time.Now().Add(5 * time.Second)
	for r.Reloads() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // polls the reload counter: Run answers hup asynchronously
	}
	if got := servedSerial(t, addr, pki); got != fourth {
		t.Fatalf("after SIGHUP serves %s, want %s (reloads %d)", got, fourth, r.Reloads())
	}
	cancel()
	<-done
}
