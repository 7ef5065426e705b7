package main

import (
	"context"
	"crypto"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
)

// fileDaemon is the daemon main run in-process from a TOML file and PEM
// files of a test PKI, listening for TLS+yamux on loopback, with its admin
// endpoint on loopback.
type fileDaemon struct {
	pki               *trusttest.PKI
	certFile, keyFile string
	addr, admin       string // the yamux listener and the admin endpoint
	logs              *syncBuffer
	cancel            context.CancelFunc
	done              chan int
}

// startFileDaemon writes the PKI's server pair and CA, a config with
// tlsExtra appended to its [tls] table, and runs main until stop.
func startFileDaemon(t *testing.T, tlsExtra string) *fileDaemon {
	t.Helper()
	dir := t.TempDir()
	fd := &fileDaemon{pki: trusttest.NewPKI(t), logs: &syncBuffer{}, done: make(chan int, 1),
		certFile: filepath.Join(dir, "server.pem"), keyFile: filepath.Join(dir, "server-key.pem")}
	fd.writeServerPair(t, fd.pki.IssueServer(t, "localhost", trusttest.LeafOptions{}))
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, fd.pki.CACertPEM(), 0o600); err != nil {
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
%s
[authority]
sqlite = %q
`, fd.certFile, fd.keyFile, caFile, tlsExtra, filepath.Join(dir, "a.db"))), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	fd.cancel = cancel
	t.Cleanup(cancel)
	readyc, adminc := make(chan string, 1), make(chan string, 1)
	th := &testHooks{
		ready: func(d *daemon.Daemon, ls []serversetup.Listener) { readyc <- ls[0].Addr().String() },
		admin: func(addr string) { adminc <- addr },
	}
	go func() {
		fd.done <- run(ctx, []string{"--config", cfgFile, "--admin-listen", "127.0.0.1:0", "--log-format", "json", "--shutdown-timeout", "1s"}, fd.logs, fd.logs, th)
	}()
	for fd.addr == "" || fd.admin == "" {
		select {
		case fd.addr = <-readyc:
		case fd.admin = <-adminc:
		case code := <-fd.done:
			t.Fatalf("daemon exited %d: %s", code, fd.logs.String())
		case <-time.After(10 * time.Second):
			t.Fatal("daemon not ready")
		}
	}
	return fd
}

// writeServerPair replaces the server certificate and key files with c
// and returns c's serial.
func (fd *fileDaemon) writeServerPair(t *testing.T, c tls.Certificate) string {
	t.Helper()
	if err := trust.WriteCredentialFiles(fd.certFile, fd.keyFile, c.Certificate, c.PrivateKey.(crypto.Signer)); err != nil {
		t.Fatal(err)
	}
	return trust.SerialString(c.Leaf)
}

// stop ends main (SIGINT-like) and checks it exits 0.
func (fd *fileDaemon) stop(t *testing.T) {
	t.Helper()
	fd.cancel()
	select {
	case code := <-fd.done:
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("daemon did not stop")
	}
}
