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

// TestExitCodes: the one exit-code table (cli.ExitCodes) for the agent and
// each subcommand: a bad flag and a bad configuration exit 2, a runtime
// failure exits 1.
func TestExitCodes(t *testing.T) {
	dir := t.TempDir()
	pki := filepath.Join(dir, "pki")
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	// A closed UDP port: nothing answers QUIC there.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := pc.LocalAddr().String()
	pc.Close()
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"bad flag", []string{"--no-such-flag"}, cli.ExitUsage, "flag provided but not defined"},
		{"missing config file", []string{"--config", filepath.Join(dir, "nope.toml")}, cli.ExitUsage, "nope.toml"},
		{"missing certificate", []string{"--endpoint", "quic://127.0.0.1:7443", "--cert", "/nope/agent.pem", "--key", "/nope/agent-key.pem", "--ca", "/nope/ca.pem"},
			cli.ExitUsage, `control_plane.credential.certificate "/nope/agent.pem"`},
		{"metrics address taken", []string{"--dev-pki", pki, "--endpoint", "quic://" + closed, "--metrics-listen", taken.Addr().String()}, cli.ExitFail, "--metrics-listen"},
		{"doctor bad flag", []string{"doctor", "--no-such-flag"}, cli.ExitUsage, "flag provided but not defined"},
		{"doctor unreachable daemon", []string{"doctor", "--dev-pki", pki, "--endpoint", "quic://" + closed, "--timeout", "300ms"}, cli.ExitFail, ""},
		{"enroll bad flag", []string{"enroll", "--no-such-flag"}, cli.ExitUsage, "flag provided but not defined"},
		{"enroll missing token", []string{"enroll", "--endpoint", "quic://" + closed}, cli.ExitUsage, "--token is required"},
		{"connection status bad flag", []string{"connection", "status", "--no-such-flag"}, cli.ExitUsage, "flag provided but not defined"},
		{"connection status no agent", []string{"connection", "status", "--status-file", filepath.Join(dir, "none.json")}, cli.ExitFail, ""},
		{"connection without status", []string{"connection"}, cli.ExitUsage, "usage"},
		{"version stray argument", []string{"version", "x"}, cli.ExitUsage, "unexpected argument"},
	} {
		code, _, errOut := runAgentCmd(t, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: %v: exit %d, stderr %q; want %d with %q", c.name, c.args, code, errOut, c.code, c.want)
		}
		if strings.Contains(errOut, "CertFile") || strings.Contains(errOut, "KeyFile") {
			t.Errorf("%s: stderr names a Go field: %q", c.name, errOut)
		}
	}
}

// TestReportedVersion: the agent reports the build's module version, not
// a hard-coded string.
func TestReportedVersion(t *testing.T) {
	if want := "forgeyard-agent/" + buildinfo.Get().Version; Version != want {
		t.Errorf("Version = %q, want %q", Version, want)
	}
}

func TestVersionAndDocs(t *testing.T) {
	code, out, _ := runAgentCmd(t, "--version")
	if code != cli.ExitOK || out != buildinfo.Get().String("forgeyard-agent")+"\n" {
		t.Errorf("--version: exit %d: %q", code, out)
	}
	root := newRoot(context.Background())
	if p := cli.DocProblems(root); len(p) > 0 {
		t.Errorf("completions and man page out of step with the command tree:\n%s", strings.Join(p, "\n"))
	}
	// Every command's --help prints its usage once, on stdout.
	root.Walk(func(path string, c *cli.Command) {
		if c.Run == nil && c != root {
			return
		}
		args := append(strings.Fields(path)[1:], "--help")
		code, out, errOut := runAgentCmd(t, args...)
		if code != cli.ExitOK || errOut != "" || strings.Count(strings.ToLower(out), "usage") == 0 || strings.Count(out, "Usage: ") > 1 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 0 and the usage once on stdout", args, code, out, errOut)
		}
	})
}
