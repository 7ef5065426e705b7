package main

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"forgeyard.dev/transport/internal/buildinfo"
	"forgeyard.dev/transport/internal/cli"
)

func runRelay(args ...string) (int, string, string) {
	var o, e bytes.Buffer
	code := run(context.Background(), args, &o, &e, nil)
	return code, o.String(), e.String()
}

// TestExitCodes: the one exit-code table (cli.ExitCodes): a bad flag and a
// bad configuration (including a configured file that does not exist)
// exit 2, a runtime failure (the listen address is taken) exits 1.
func TestExitCodes(t *testing.T) {
	dir := t.TempDir()
	pki := filepath.Join(dir, "pki")
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"bad flag", []string{"--no-such-flag"}, cli.ExitUsage, "flag provided but not defined"},
		{"stray argument", []string{"extra"}, cli.ExitUsage, "unexpected argument"},
		{"missing config file", []string{"--config", filepath.Join(dir, "nope.toml")}, cli.ExitUsage, "nope.toml"},
		{"missing certificate", []string{"--cert", "/nope/relay.pem", "--key", "/nope/relay-key.pem", "--client-ca", "/nope/ca.pem",
			"--upstream", "quic://127.0.0.1:7443", "--listen-yamux", "127.0.0.1:0"}, cli.ExitUsage, `tls.certificate \"/nope/relay.pem`},
		{"listen address taken", []string{"--dev-pki", pki, "--upstream", "quic://127.0.0.1:7443", "--listen-yamux", taken.Addr().String()}, cli.ExitFail, "relay failed"},
	} {
		code, _, errOut := runRelay(c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: %v: exit %d, stderr %q; want %d with %q", c.name, c.args, code, errOut, c.code, c.want)
		}
		if strings.Contains(errOut, "CertFile") || strings.Contains(errOut, "KeyFile") {
			t.Errorf("%s: stderr names a Go field: %q", c.name, errOut)
		}
	}
}

func TestVersionAndDocs(t *testing.T) {
	code, out, _ := runRelay("--version")
	if code != cli.ExitOK || out != buildinfo.Get().String("forgeyard-relay")+"\n" {
		t.Errorf("--version: exit %d: %q", code, out)
	}
	if p := cli.DocProblems(newRoot()); len(p) > 0 {
		t.Errorf("completions and man page out of step with the command tree:\n%s", strings.Join(p, "\n"))
	}
	code, out, errOut := runRelay("--help")
	if code != cli.ExitOK || errOut != "" || strings.Count(out, "Usage: forgeyard-relay") != 1 {
		t.Errorf("--help: exit %d, stderr %q, usage %d times", code, errOut, strings.Count(out, "Usage: forgeyard-relay"))
	}
}
