package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/adminapi"
	"forgeyard.dev/transport/internal/buildinfo"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/wire"
)

// TestHelpAndBadFlagEveryCommand walks the command tree: every command's
// --help prints its usage once, on stdout, and exits 0; every leaf refuses
// an unknown flag with exit 2 and says so on stderr only.
func TestHelpAndBadFlagEveryCommand(t *testing.T) {
	n := 0
	root.Walk(func(path string, c *cli.Command) {
		args := strings.Fields(path)[1:]
		code, out, errOut := runCLI(t, append(args, "--help")...)
		if code != cli.ExitOK || errOut != "" || strings.Count(strings.ToLower(out), "usage") == 0 || strings.Count(out, "Usage: ") > 1 {
			t.Errorf("%s --help: exit %d, stdout %q, stderr %q; want 0 and the usage once on stdout", path, code, out, errOut)
		}
		if c.Run == nil || c.Name == "man" {
			return
		}
		n++
		code, out, errOut = runCLI(t, append(args, "--no-such-flag")...)
		if code != cli.ExitUsage || out != "" || !strings.Contains(errOut, "no-such-flag") {
			t.Errorf("%s --no-such-flag: exit %d, stdout %q, stderr %q; want %d and the error on stderr", path, code, out, errOut, cli.ExitUsage)
		}
	})
	if n < 12 {
		t.Errorf("walked only %d leaves", n)
	}
}

// TestExitCodes: the one exit-code table (cli.ExitCodes) for every
// subcommand: a bad flag or argument and a bad configuration exit 2, a
// runtime failure 1.
func TestExitCodes(t *testing.T) {
	dir := t.TempDir()
	corrupt := filepath.Join(dir, "corrupt.db")
	os.WriteFile(corrupt, bytes.Repeat([]byte("not a database "), 512), 0o600)
	notDir := filepath.Join(dir, "file")
	os.WriteFile(notDir, []byte("x"), 0o600)
	runner := wire.NewRunnerId().String()
	// A closed port: nothing answers there.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	for _, c := range []struct {
		name string
		args []string
		code int
		want string // on stderr
	}{
		{"unknown command", []string{"nope"}, cli.ExitUsage, `unknown command "nope"`},
		{"no command", nil, cli.ExitUsage, "Usage: forgeyard"},
		{"stray argument", []string{"runner", "token", "list", "--sqlite", corrupt, "extra"}, cli.ExitUsage, `unexpected argument "extra"`},
		{"dev-certs bad value", []string{"dev-certs", "--dir", dir, "--agents", "0"}, cli.ExitUsage, "--agents must be"},
		{"dev-certs runtime", []string{"dev-certs", "--dir", notDir}, cli.ExitFail, "forgeyard dev-certs:"},
		{"transport missing token file", []string{"transport", "status", "--admin", closed, "--token-file", "/nope/token"}, cli.ExitUsage, "--token-file"},
		{"transport bad admin URL", []string{"transport", "sessions", "--admin", "gopher://x"}, cli.ExitUsage, "forgeyard transport sessions:"},
		{"transport daemon unreachable", []string{"transport", "status", "--admin", closed}, cli.ExitFail, "forgeyard transport status:"},
		{"transport doctor unreachable", []string{"transport", "doctor", "--admin", closed}, cli.ExitFail, ""},
		{"runner missing config", []string{"runner", "token", "list", "--config", "/nope/daemon.toml"}, cli.ExitUsage, "/nope/daemon.toml"},
		{"runner missing dsn file", []string{"runner", "cert", "list", "--postgres-dsn-file", "/nope/dsn", "--runner", runner}, cli.ExitUsage, "authority.postgres_dsn_file"},
		{"runner corrupt authority", []string{"runner", "token", "list", "--sqlite", corrupt}, cli.ExitFail, "authority.sqlite"},
		{"runner bad runner id", []string{"runner", "enable", "--sqlite", corrupt, "--runner", "x"}, cli.ExitUsage, "not a RunnerId"},
		{"version stray argument", []string{"version", "x"}, cli.ExitUsage, "unexpected argument"},
	} {
		code, _, errOut := runCLI(t, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: %v: exit %d, stderr %q; want %d with %q", c.name, c.args, code, errOut, c.code, c.want)
		}
	}
}

func TestVersion(t *testing.T) {
	v := buildinfo.Get()
	code, out, _ := runCLI(t, "--version")
	if code != cli.ExitOK || out != v.String("forgeyard")+"\n" || !strings.Contains(out, "protocol "+wire.Supported.Min.String()+"-"+wire.Supported.Max.String()) {
		t.Errorf("--version: exit %d: %q", code, out)
	}
	code, out, _ = runCLI(t, "version")
	if code != cli.ExitOK || !strings.HasPrefix(out, "forgeyard "+v.Version+"\n") || !strings.Contains(out, "module:    forgeyard.dev/transport") {
		t.Errorf("version: exit %d: %q", code, out)
	}
}

// TestHelpNamesNoSourceFile: `forgeyard --help` is for operators.
func TestHelpNamesNoSourceFile(t *testing.T) {
	_, out, _ := runCLI(t, "--help")
	if m := regexp.MustCompile(`\b\w+\.go\b`).FindString(out); m != "" {
		t.Errorf("--help names %q:\n%s", m, out)
	}
}

// TestCompletionAndMan: every command and flag of the tree is in the bash,
// zsh and fish completions and in the man page, and the subcommands print
// them.
func TestCompletionAndMan(t *testing.T) {
	if p := cli.DocProblems(root); len(p) > 0 {
		t.Errorf("completions and man page out of step with the command tree:\n%s", strings.Join(p, "\n"))
	}
	for _, sh := range cli.Shells {
		code, out, errOut := runCLI(t, "completion", sh)
		if code != cli.ExitOK || !strings.Contains(out, "runner token list") || !strings.Contains(out, "--postgres-dsn-file") {
			t.Errorf("completion %s: exit %d, stderr %q:\n%s", sh, code, errOut, out)
		}
	}
	code, out, _ := runCLI(t, "man")
	if code != cli.ExitOK || !strings.HasPrefix(out, `.\" Generated by`) || !strings.Contains(out, ".B forgeyard runner cert revoke") {
		t.Errorf("man: exit %d:\n%s", code, out)
	}
}

// TestStatusDaemonName: status names the daemon by its id, else by its
// host, never as "-".
func TestStatusDaemonName(t *testing.T) {
	for _, c := range []struct {
		st   adminapi.Status
		want string
	}{
		{adminapi.Status{Daemon: "d1", Host: "h"}, "d1"},
		{adminapi.Status{Host: "build-01"}, "build-01 (no id configured: set key id)"},
		{adminapi.Status{}, "unnamed (no id configured: set key id)"},
	} {
		if got := daemonName(&c.st); got != c.want {
			t.Errorf("daemonName(%+v) = %q, want %q", c.st, got, c.want)
		}
		var b bytes.Buffer
		writeStatus(&b, &c.st, time.Now())
		if !regexp.MustCompile(`(?m)^DAEMON\s+` + regexp.QuoteMeta(c.want) + `$`).MatchString(b.String()) {
			t.Errorf("status shows:\n%s", b.String())
		}
	}
}
