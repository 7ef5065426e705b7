package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runDaemon(t *testing.T, ctx context.Context, th *testHooks, args ...string) (int, string, string) {
	t.Helper()
	var o, e bytes.Buffer
	code := run(ctx, args, &o, &e, th)
	return code, o.String(), e.String()
}

func TestHelp(t *testing.T) {
	code, out, _ := runDaemon(t, context.Background(), nil, "--help")
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"--config", "-listen", "-listen-yamux", "-cert", "-key", "-client-ca", "-sqlite", "-postgres-dsn-file", "-log-level", "-demo-leases", "DEVELOPMENT ONLY", "SIGINT"} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q", want)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("[tls]\ncertificate = \"s.pem\"\nprivate_key = \"-----BEGIN PRIVATE KEY-----\"\nclient_ca = \"ca.pem\"\n[authority]\nsqlite = \"a.db\"\n"), 0o600)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "flag provided but not defined"},
		{[]string{"extra"}, "unexpected argument"},
		{[]string{"--sqlite", "a.db"}, "tls.certificate: required"},
		{[]string{"--config", bad}, "bad.toml: tls.private_key: holds inline PEM"},
		{[]string{"--config", filepath.Join(dir, "missing.toml")}, "no such file"},
		{[]string{"--dev-pki", filepath.Join(dir, "pki"), "--listen", "nope"}, "listen.quic"},
		{[]string{"--demo-leases", "-1"}, "--demo-leases"},
	} {
		code, _, errOut := runDaemon(t, context.Background(), nil, c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 containing %q", c.args, code, errOut, c.want)
		}
	}
}
