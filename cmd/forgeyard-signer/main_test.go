package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/daemonsetup"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/signer"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/signing"
)

// TestKeygen: keygen creates a 0600 PKCS#8 key the worker loads, prints
// its public key, and never overwrites a file.
func TestKeygen(t *testing.T) {
	dir := t.TempDir()
	for _, alg := range []string{"ed25519", "p256"} {
		out := filepath.Join(dir, alg+".pem")
		var o, e bytes.Buffer
		if code := run(context.Background(), []string{"keygen", "--ref", "k-" + alg, "--algorithm", alg, "--out", out}, &o, &e, nil); code != cli.ExitOK {
			t.Fatalf("keygen %s: exit %d: %s", alg, code, e.String())
		}
		st, err := os.Stat(out)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("key file %v mode %v", err, st.Mode())
		}
		if !strings.Contains(o.String(), "BEGIN PUBLIC KEY") {
			t.Fatalf("keygen printed %q", o.String())
		}
		if _, err := signer.LoadKeyFile(out, "k-"+alg); err != nil {
			t.Fatal(err)
		}
		if code := run(context.Background(), []string{"keygen", "--ref", "k", "--out", out}, &o, &e, nil); code != cli.ExitFail {
			t.Fatalf("keygen over an existing key: exit %d", code)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "ed25519.pem"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := signer.LoadKeyFile(filepath.Join(dir, "ed25519.pem"), "k"); err == nil {
		t.Fatal("a 0644 key file was loaded")
	}
}

func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--nope"}, "flag provided but not defined"},
		{[]string{"--dev-pki", filepath.Join(dir, "pki"), "--endpoint", "quic://h"}, "keys: required"},
		{[]string{"--dev-pki", filepath.Join(dir, "pki"), "--endpoint", "quic://h", "--key-file", "nofile"}, "want NAME=FILE"},
		{[]string{"keygen", "--ref", "k", "--out", filepath.Join(dir, "x"), "--algorithm", "rsa"}, "want ed25519 or p256"},
	} {
		var o, e bytes.Buffer
		if code := run(context.Background(), c.args, &o, &e, nil); code != cli.ExitUsage || !strings.Contains(e.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 with %q", c.args, code, e.String(), c.want)
		}
	}
}

// TestSigner runs the command in-process against a daemon over QUIC with
// keys made by keygen and a policy authority made by policy-keygen: it
// registers as a signing worker, the daemon's Sign gets a signature that
// verifies with the printed public key, and it exits 0 on SIGINT.
func TestSigner(t *testing.T) {
	dir := t.TempDir()
	pkiDir := filepath.Join(dir, "pki")
	var o, e bytes.Buffer
	keyFile, pubFile := filepath.Join(dir, "release.pem"), filepath.Join(dir, "release.pub.pem")
	if code := run(context.Background(), []string{"keygen", "--ref", "release", "--out", keyFile, "--pub", pubFile}, &o, &e, nil); code != cli.ExitOK {
		t.Fatalf("keygen: %s", e.String())
	}
	polKey, polPub := filepath.Join(dir, "policy.pem"), filepath.Join(dir, "policy.pub.pem")
	if code := run(context.Background(), []string{"policy-keygen", "--out", polKey, "--pub", polPub}, &o, &e, nil); code != cli.ExitOK {
		t.Fatalf("policy-keygen: %s", e.String())
	}
	registered := make(chan daemon.SessionInfo, 2)
	d, addr := testDaemon(t, pkiDir, daemon.Hooks{OnRegistered: func(s daemon.SessionInfo) { registered <- s }}, io.Discard)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		done <- run(ctx, []string{"--dev-pki", pkiDir, "--dev-agent", "signer", "--endpoint", "quic://" + addr, "--server-name", "localhost",
			"--key-file", "release=" + keyFile, "--policy", "release/v1=" + polPub}, io.Discard, &stderr, &testHooks{ready: func(*agent.Agent, *signer.Worker) {}})
	}()
	select {
	case s := <-registered:
		if s.Role != agentwire.RoleSigningWorker {
			t.Fatalf("registered as %s", s.Role)
		}
	case code := <-done:
		t.Fatalf("signer exited %d: %s", code, stderr.String())
	case <-time.After(15 * time.Second):
		t.Fatal("signer never registered")
	}
	b, _ := os.ReadFile(polKey)
	blk, _ := pem.Decode(b)
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	now := uint64(time.Now().UnixMilli())
	m := &signing.SignRequestV1{KeyRef: "release", Algorithm: signing.Ed25519, Subject: sha256.Sum256([]byte("release 1.0")),
		Policy: signing.PolicyProofV1{PolicyID: "release/v1", IssuedAtMs: now, ExpiresAtMs: now + 60_000}}
	signer.Attest(k.(ed25519.PrivateKey), m)
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	// OnRegistered fires before the accept is sent; the worker announces
	// its keys after it: until then Sign finds no worker for the key.
	// Wait for that condition (bounded by sctx), nothing else.
	var res daemon.SignResult
	for {
		res, err = d.Sign(sctx, daemon.SignRequest{KeyRef: m.KeyRef, Algorithm: m.Algorithm, Subject: m.Subject, Policy: m.Policy})
		if !errors.Is(err, daemon.ErrNoSigningWorker) || sctx.Err() != nil {
			break
		}
		select {
		case <-sctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	pb, _ := os.ReadFile(pubFile)
	pub, err := signer.ParsePublicKeyPEM(pb)
	if err != nil {
		t.Fatal(err)
	}
	if !signer.Verify(signing.Ed25519, pub, m.Subject[:], res.Signature) {
		t.Fatal("signature does not verify with keygen's public key")
	}
	cancel()
	if code := <-done; code != cli.ExitOK {
		t.Fatalf("exit %d after SIGINT: %s", code, stderr.String())
	}
}

func testDaemon(t *testing.T, pkiDir string, hooks daemon.Hooks, log io.Writer) (*daemon.Daemon, string) {
	t.Helper()
	if _, err := trust.GenerateDevPKI(pkiDir, trust.DevPKIOptions{Agents: []string{"signer"}}); err != nil {
		t.Fatal(err)
	}
	var stls config.ServerTLS
	if _, err := daemonsetup.DevDaemon(pkiDir, &stls); err != nil {
		t.Fatal(err)
	}
	tc, err := serversetup.ServerTLS(stls)
	if err != nil {
		t.Fatal(err)
	}
	au, err := authority.OpenSQLite(context.Background(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	d, err := daemon.New(daemon.Config{Authority: au, Hooks: hooks, Features: wire.Implemented, Logger: slog.New(slog.NewTextHandler(log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := quic.Listen("127.0.0.1:0", tc, quic.Config{})
	if err != nil {
		t.Fatal(err)
	}
	go d.Serve(context.Background(), ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.Shutdown(ctx)
		ln.Close()
		au.Close()
	})
	return d, ln.Addr().String()
}
