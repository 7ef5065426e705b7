package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// TestServerCertificateReloaded runs the daemon main with PEM files and
// tls.reload_interval = 50ms, replaces the certificate and key files while
// it serves, and shows a new TLS+yamux handshake getting the new
// certificate without a restart (and the reload logged).
func TestServerCertificateReloaded(t *testing.T) {
	fd := startFileDaemon(t, `reload_interval = "50ms"`)
	pki, addr := fd.pki, fd.addr
	first := trust.SerialString(mustLoadLeaf(t, fd.certFile))
	client := pki.ClientConfig(t, wire.NewRunnerId(), "localhost")
	served := func() string {
		c, err := tls.Dial("tcp", addr, client)
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		defer c.Close()
		return trust.SerialString(c.ConnectionState().PeerCertificates[0])
	}
	if got := served(); got != first {
		t.Fatalf("serves %s, want %s", got, first)
	}
	second := fd.writeServerPair(t, pki.IssueServer(t, "localhost", trusttest.LeafOptions{}))
	got := served()
	for deadline := time.Now().Add(5 * time.Second); got != second && time.Now().Before(deadline); got = served() {
		time.Sleep(20 * time.Millisecond) // the reloader checks every 50 ms; each probe is a real handshake
	}
	if got != second {
		t.Fatalf("after replacing the files the daemon serves %s, want %s; log:\n%s", got, second, fd.logs.String())
	}
	if !strings.Contains(fd.logs.String(), `"msg":"server certificate reloaded"`) || !strings.Contains(fd.logs.String(), second) {
		t.Errorf("reload not logged with the new serial:\n%s", fd.logs.String())
	}
	fd.stop(t)
}

func mustLoadLeaf(t *testing.T, certFile string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", certFile)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
