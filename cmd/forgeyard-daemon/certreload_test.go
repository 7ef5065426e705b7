package main

import (
	"context"
	"crypto"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/config/setup"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// TestServerCertificateReloaded runs the daemon main with PEM files and
// tls.reload_interval = 50ms, replaces the certificate and key files while
// it serves, and shows a new TLS+yamux handshake getting the new
// certificate without a restart (and the reload logged).
func TestServerCertificateReloaded(t *testing.T) {
	dir := t.TempDir()
	pki := trusttest.NewPKI(t)
	certFile, keyFile, caFile := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"), filepath.Join(dir, "ca.pem")
	write := func(c tls.Certificate) string {
		if err := trust.WriteCredentialFiles(certFile, keyFile, c.Certificate, c.PrivateKey.(crypto.Signer)); err != nil {
			t.Fatal(err)
		}
		return trust.SerialString(c.Leaf)
	}
	first := write(pki.IssueServer(t, "localhost", trusttest.LeafOptions{}))
	if err := os.WriteFile(caFile, pki.CACertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "daemon.toml")
	if err := os.WriteFile(cfgFile, []byte(fmt.Sprintf(`
[listen]
yamux = "127.0.0.1:0"
[tls]
certificate = %q
private_key = %q
client_ca = %q
reload_interval = "50ms"
[authority]
sqlite = %q
`, certFile, keyFile, caFile, filepath.Join(dir, "a.db"))), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	readyc := make(chan string, 1)
	th := &testHooks{ready: func(d *daemon.Daemon, ls []setup.Listener) { readyc <- ls[0].Addr().String() }}
	var logs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--config", cfgFile, "--log-format", "json", "--shutdown-timeout", "1s"}, &logs, &logs, th)
	}()
	var addr string
	select {
	case addr = <-readyc:
	case code := <-done:
		t.Fatalf("daemon exited %d: %s", code, logs.String())
	case <-time.After(10 * time.Second):
		t.Fatal("daemon not ready")
	}
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
	second := write(pki.IssueServer(t, "localhost", trusttest.LeafOptions{}))
	got := served()
	for deadline := time.Now().Add(5 * time.Second); got != second && time.Now().Before(deadline); got = served() {
		time.Sleep(20 * time.Millisecond) // the reloader checks every 50 ms; each probe is a real handshake
	}
	if got != second {
		t.Fatalf("after replacing the files the daemon serves %s, want %s; log:\n%s", got, second, logs.String())
	}
	if !strings.Contains(logs.String(), `"msg":"server certificate reloaded"`) || !strings.Contains(logs.String(), second) {
		t.Errorf("reload not logged with the new serial:\n%s", logs.String())
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("daemon did not stop")
	}
}
