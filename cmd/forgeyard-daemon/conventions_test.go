package main

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"forgeyard.dev/transport/internal/buildinfo"
	"forgeyard.dev/transport/internal/cli"
)

// TestExitCodes: the one exit-code table (cli.ExitCodes): a bad flag and a
// bad configuration (including a configured file that does not exist)
// exit 2, a runtime failure (the listen address is taken) exits 1.
func TestExitCodes(t *testing.T) {
	dir := t.TempDir()
	pki := filepath.Join(dir, "pki")
	taken, err := net.ListenPacket("udp", "127.0.0.1:0")
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
		{"missing config file", []string{"--config", filepath.Join(dir, "nope.toml")}, cli.ExitUsage, "nope.toml"},
		{"missing certificate", []string{"--cert", "/nope/server.pem", "--key", "/nope/server-key.pem", "--client-ca", "/nope/ca.pem",
			"--sqlite", filepath.Join(dir, "a.db"), "--listen", "127.0.0.1:0"}, cli.ExitUsage, `tls.certificate \"/nope/server.pem`}, // logged: quotes escaped
		{"missing dsn file", []string{"--dev-pki", pki, "--postgres-dsn-file", "/nope/dsn", "--listen", "127.0.0.1:0"}, cli.ExitUsage, "authority.postgres_dsn_file"},
		{"listen address taken", []string{"--dev-pki", pki, "--sqlite", filepath.Join(dir, "b.db"), "--listen", taken.LocalAddr().String()}, cli.ExitFail, "daemon failed"},
		{"version stray argument", []string{"version", "x"}, cli.ExitUsage, "unexpected argument"},
	} {
		code, _, errOut := runDaemon(t, context.Background(), nil, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: %v: exit %d, stderr %q; want %d with %q", c.name, c.args, code, errOut, c.code, c.want)
		}
		if strings.Contains(errOut, "CertFile") || strings.Contains(errOut, "KeyFile") {
			t.Errorf("%s: stderr names a Go field: %q", c.name, errOut)
		}
	}
}

func TestVersionAndDocs(t *testing.T) {
	code, out, _ := runDaemon(t, context.Background(), nil, "--version")
	if code != cli.ExitOK || out != buildinfo.Get().String("forgeyard-daemon")+"\n" {
		t.Errorf("--version: exit %d: %q", code, out)
	}
	code, out, _ = runDaemon(t, context.Background(), nil, "version", "--json")
	if code != cli.ExitOK || !strings.Contains(out, `"program": "forgeyard-daemon"`) {
		t.Errorf("version --json: exit %d: %q", code, out)
	}
	if p := cli.DocProblems(newRoot()); len(p) > 0 {
		t.Errorf("completions and man page out of step with the command tree:\n%s", strings.Join(p, "\n"))
	}
	code, out, _ = runDaemon(t, context.Background(), nil, "man")
	if code != cli.ExitOK || !strings.Contains(out, `\fB\-\-admin\-socket\fR`) || !strings.Contains(out, ".SH EXIT STATUS") {
		t.Errorf("man: exit %d:\n%s", code, out)
	}
	// --help prints the usage once, on stdout.
	code, out, errOut := runDaemon(t, context.Background(), nil, "--help")
	if code != cli.ExitOK || errOut != "" || strings.Count(out, "Usage: forgeyard-daemon") != 1 {
		t.Errorf("--help: exit %d, stderr %q, usage %d times", code, errOut, strings.Count(out, "Usage: forgeyard-daemon"))
	}
}
