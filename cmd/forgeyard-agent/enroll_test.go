package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust"
)

// TestEnrollCommand: `forgeyard-agent enroll` obtains a certificate from a
// daemon over QUIC with a one-time token and writes it with a key made
// locally; the token does not work twice; existing files are not replaced
// without --force.
func TestEnrollCommand(t *testing.T) {
	dir := t.TempDir()
	pki, err := trust.GenerateDevPKI(filepath.Join(dir, "pki"), trust.DevPKIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	au, err := authority.OpenSQLite(ctx, filepath.Join(dir, "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer au.Close()
	tok, _ := trust.NewEnrollmentToken()
	now := time.Now()
	if err := authority.IdentitiesOf(au).CreateEnrollmentToken(ctx, authority.EnrollmentToken{Hash: trust.HashEnrollmentToken(tok),
		ID: trust.EnrollmentTokenID(tok), Name: "ci-box", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	is, err := trust.LoadIssuer(pki.CA.CertFile, pki.CA.KeyFile, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tlsConf, err := trust.ServerConfig(trust.ServerFiles{CertFile: pki.Server.CertFile, KeyFile: pki.Server.KeyFile, ClientCAFile: pki.CA.CertFile})
	if err != nil {
		t.Fatal(err)
	}
	d, err := daemon.New(daemon.Config{Authority: au, Identity: daemon.IdentityConfig{Issuer: is}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := quic.Listen("127.0.0.1:0", tlsConf, quic.Config{})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = d.Serve(ctx, l) }()
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_ = d.Shutdown(sctx)
		<-served
	}()
	certOut, keyOut := filepath.Join(dir, "agent.pem"), filepath.Join(dir, "agent-key.pem")
	args := []string{"enroll", "--token", tok, "--endpoint", "quic://" + l.Addr().String(), "--ca", pki.CA.CertFile,
		"--server-name", "localhost", "--cert", certOut, "--key", keyOut, "--timeout", "10s"}
	var out, errOut bytes.Buffer
	if code := run(ctx, args, &out, &errOut, nil); code != cli.ExitOK {
		t.Fatalf("enroll: exit %d: %s", code, errOut.String())
	}
	creds, err := trust.LoadCredentials(certOut, keyOut)
	if err != nil {
		t.Fatalf("written credentials: %v", err)
	}
	runner, err := creds.Runner()
	if err != nil || !strings.Contains(out.String(), "enrolled as runner "+runner.String()) || creds.Leaf().Subject.CommonName != "ci-box" {
		t.Fatalf("output %q, runner %v %v", out.String(), runner, err)
	}
	out.Reset()
	errOut.Reset()
	if code := run(ctx, args, &out, &errOut, nil); code != cli.ExitUsage || !strings.Contains(errOut.String(), "already be enrolled") {
		t.Fatalf("existing files: exit %d: %s", code, errOut.String())
	}
	errOut.Reset()
	if code := run(ctx, append(args, "--force"), &out, &errOut, nil); code != cli.ExitFail || !strings.Contains(errOut.String(), "already used") {
		t.Fatalf("second use: exit %d: %s", code, errOut.String())
	}
	// The refused attempt left the enrolled files alone.
	if again, err := trust.LoadCredentials(certOut, keyOut); err != nil || trust.SerialString(again.Leaf()) != trust.SerialString(creds.Leaf()) {
		t.Fatalf("files changed: %v", err)
	}
}
