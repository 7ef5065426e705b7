package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
)

// TestRunnerTokenLifecycle drives `forgeyard runner token create|list|
// revoke`, `runner disable|enable` and `runner cert revoke` against a
// SQLite authority and checks the store after each step.
func TestRunnerTokenLifecycle(t *testing.T) {
	db := filepath.Join(t.TempDir(), "authority.db")
	createAuthority(t, db) // as the daemon's first start does
	code, out, errOut := runCLI(t, "runner", "token", "create", "--sqlite", db, "--name", "build-9", "--label", "linux", "--ttl", "1h")
	if code != cli.ExitOK {
		t.Fatalf("create: exit %d: %s", code, errOut)
	}
	tok := regexp.MustCompile(`token:\s+(fyet_\S+)`).FindStringSubmatch(out)
	id := regexp.MustCompile(`id:\s+(\S+)`).FindStringSubmatch(out)
	if tok == nil || id == nil || trust.CheckEnrollmentToken(tok[1]) != nil || id[1] != trust.EnrollmentTokenID(tok[1]) {
		t.Fatalf("create output:\n%s", out)
	}
	ctx := context.Background()
	au, err := authority.OpenSQLite(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	ids := authority.IdentitiesOf(au)
	runner := wire.NewRunnerId()
	if _, err := ids.ConsumeEnrollmentToken(ctx, trust.HashEnrollmentToken(tok[1]), runner, time.Now()); err != nil {
		t.Fatalf("the created token does not enroll: %v", err)
	}
	au.Close()
	code, out, _ = runCLI(t, "runner", "token", "list", "--sqlite", db)
	if code != cli.ExitOK || !strings.Contains(out, id[1]) || !strings.Contains(out, runner.String()) || strings.Contains(out, tok[1]) {
		t.Fatalf("list (exit %d):\n%s", code, out)
	}
	code, _, errOut = runCLI(t, "runner", "token", "revoke", "--sqlite", db, "--id", id[1])
	if code != cli.ExitFail || !strings.Contains(errOut, "already used") {
		t.Fatalf("revoke of a used token: exit %d: %s", code, errOut)
	}
	code, _, errOut = runCLI(t, "runner", "disable", "--sqlite", db, "--runner", runner.String(), "--reason", "stolen laptop")
	if code != cli.ExitOK {
		t.Fatalf("disable: exit %d: %s", code, errOut)
	}
	au, err = authority.OpenSQLite(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	st, err := au.RunnerStatus(ctx, runner)
	au.Close()
	if err != nil || st.Enabled || st.Reason != "stolen laptop" {
		t.Fatalf("status after disable: %+v, %v", st, err)
	}
	if code, _, _ := runCLI(t, "runner", "enable", "--sqlite", db, "--runner", runner.String()); code != cli.ExitOK {
		t.Fatal("enable failed")
	}
	code, _, errOut = runCLI(t, "runner", "cert", "revoke", "--sqlite", db, "--serial", "abcd")
	if code != cli.ExitFail || !strings.Contains(errOut, "not found") {
		t.Fatalf("revoke of an unknown serial: exit %d: %s", code, errOut)
	}
	if code, _, errOut := runCLI(t, "runner", "disable", "--runner", runner.String()); code != cli.ExitUsage || !strings.Contains(errOut, "no authority") {
		t.Fatalf("no authority: exit %d: %s", code, errOut)
	}
	if code, _, _ := runCLI(t, "runner", "disable", "--sqlite", db, "--runner", "nope"); code != cli.ExitUsage {
		t.Fatal("bad runner id accepted")
	}
}

// createAuthority creates an empty SQLite authority at path, as a daemon's
// first start does.
func createAuthority(t *testing.T, path string) {
	t.Helper()
	au, err := authority.OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	au.Close()
}

// TestRunnerCommandsNeverCreateAuthority: a mistyped --sqlite path is a
// configuration error (exit 2) naming the key, and no database appears
// there; before, `runner disable --sqlite typo.db` created one, printed
// "disabled" and exited 0.
func TestRunnerCommandsNeverCreateAuthority(t *testing.T) {
	typo := filepath.Join(t.TempDir(), "typo.db")
	for _, args := range [][]string{
		{"runner", "disable", "--sqlite", typo, "--runner", wire.NewRunnerId().String(), "--reason", "typo"},
		{"runner", "token", "create", "--sqlite", typo, "--name", "x"},
		{"runner", "token", "list", "--sqlite", typo},
	} {
		code, out, errOut := runCLI(t, args...)
		if code != cli.ExitUsage || !strings.Contains(errOut, "authority.sqlite") || strings.Contains(out, "disabled") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit %d naming authority.sqlite", args, code, out, errOut, cli.ExitUsage)
		}
		if _, err := os.Stat(typo); !os.IsNotExist(err) {
			t.Fatalf("%v created %s (stat: %v)", args, typo, err)
		}
	}
}
