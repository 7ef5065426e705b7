package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

func TestDevCertsJSONAndIdempotence(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	code, out, errOut := runCLI(t, "dev-certs", "--dir", dir, "--agent", "alpha", "--agent", "beta", "--server-name", "daemon.test", "--json")
	if code != cli.ExitOK {
		t.Fatalf("exit %d, stderr %s", code, errOut)
	}
	var first trust.DevPKI
	if err := json.Unmarshal([]byte(out), &first); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, out)
	}
	if len(first.Agents) != 2 || first.Agents[0].Name != "alpha" || first.Agents[0].Runner == (wire.RunnerId{}) || !first.Agents[0].Created {
		t.Fatalf("agents %+v", first.Agents)
	}
	if first.Dir != dir || !strings.Contains(strings.Join(first.Server.Names, ","), "daemon.test") {
		t.Fatalf("dir %q names %v", first.Dir, first.Server.Names)
	}
	st, err := os.Stat(first.Agents[0].KeyFile)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("agent key: %v %v", st, err)
	}

	// Text output of a rerun: everything reused, RunnerIds printed and unchanged.
	code, out, errOut = runCLI(t, "dev-certs", "--dir", dir, "--agent", "alpha", "--server-name", "daemon.test")
	if code != cli.ExitOK {
		t.Fatalf("rerun exit %d, stderr %s", code, errOut)
	}
	for _, want := range []string{dir, "ca.pem", "server.pem", "agent-alpha.pem", "agent-beta.pem", first.Agents[0].Runner.String(), first.Agents[1].Runner.String(), "reused", "dev-pki.json"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "created") {
		t.Errorf("rerun created something:\n%s", out)
	}
	loaded, err := trust.LoadDevPKI(dir)
	if err != nil {
		t.Fatal(err)
	}
	if a, ok := loaded.Agent("beta"); !ok || a.Runner != first.Agents[1].Runner {
		t.Fatalf("manifest agent beta = %+v", a)
	}
}

func TestDevCertsAgentsCount(t *testing.T) {
	dir := t.TempDir()
	code, out, errOut := runCLI(t, "dev-certs", "--dir", dir, "--agents", "3")
	if code != cli.ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, f := range []string{"agent-1.pem", "agent-2-key.pem", "agent-3.pem"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	if strings.Count(out, "runner ") != 3 {
		t.Errorf("want 3 runners in output:\n%s", out)
	}
	// Default: one agent.
	dir2 := t.TempDir()
	if code, _, errOut := runCLI(t, "dev-certs", "--dir", dir2); code != cli.ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if p, err := trust.LoadDevPKI(dir2); err != nil || len(p.Agents) != 1 || p.Agents[0].Name != "1" {
		t.Fatalf("default agents: %+v %v", p, err)
	}
}

func TestDevCertsConflictAndForce(t *testing.T) {
	dir := t.TempDir()
	if code, _, e := runCLI(t, "dev-certs", "--dir", dir); code != cli.ExitOK {
		t.Fatal(e)
	}
	if err := os.Remove(filepath.Join(dir, "ca-key.pem")); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCLI(t, "dev-certs", "--dir", dir)
	if code != cli.ExitFail || !strings.Contains(errOut, "ca-key.pem") || !strings.Contains(errOut, "--force") {
		t.Fatalf("exit %d, stderr %q; want 1 naming ca-key.pem and --force", code, errOut)
	}
	code, out, errOut := runCLI(t, "dev-certs", "--dir", dir, "--force")
	if code != cli.ExitOK || strings.Contains(out, "reused") {
		t.Fatalf("force: exit %d\n%s\n%s", code, out, errOut)
	}
}

func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{},
		{"nope"},
		{"dev-certs", "--bogus"},
		{"dev-certs", "--dir", dir, "extra"},
		{"dev-certs", "--dir", dir, "--agents", "2", "--agent", "x"},
		{"dev-certs", "--dir", dir, "--agents", "0"},
		{"dev-certs", "--dir", dir, "--agents", "1001"},
		{"dev-certs", "--dir", dir, "--agents", "two"},
		{"dev-certs", "--dir", dir, "--agent", "../evil"},
		{"dev-certs", "--dir", dir, "--agent", "a", "--agent", "a"},
		{"dev-certs", "--dir", dir, "--server-name", "not a name"},
		{"dev-certs", "--dir", ""},
	} {
		code, out, errOut := runCLI(t, args...)
		if code != cli.ExitUsage {
			t.Errorf("%q: exit %d, want %d (stderr %q)", args, code, cli.ExitUsage, errOut)
		}
		if errOut == "" || out != "" {
			t.Errorf("%q: usage errors belong on stderr only (stdout %q)", args, out)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("usage errors wrote %d files", len(ents))
	}
}

func TestHelp(t *testing.T) {
	code, out, _ := runCLI(t, "dev-certs", "--help")
	if code != cli.ExitOK {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"forgeyard://runner/<ULID>", "--force", "-server-name", "dev-pki.json", "NOT for production", "0600"} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q", want)
		}
	}
	code, out, _ = runCLI(t, "--help")
	if code != cli.ExitOK || !strings.Contains(out, "dev-certs") {
		t.Fatalf("top-level help: exit %d\n%s", code, out)
	}
}
