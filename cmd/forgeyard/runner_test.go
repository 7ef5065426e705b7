package main

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
)

// TestRunnerTokenLifecycle drives `forgeyard runner token create|list|
// revoke`, `runner disable|enable` and `runner cert revoke` against a
// SQLite authority and checks the store after each step.
func TestRunnerTokenLifecycle(t *testing.T) {
	db := filepath.Join(t.TempDir(), "authority.db")
	code, out, errOut := runCLI(t, "runner", "token", "create", "--sqlite", db, "--name", "build-9", "--label", "linux", "--ttl", "1h")
	if code != exitOK {
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
	if code != exitOK || !strings.Contains(out, id[1]) || !strings.Contains(out, runner.String()) || strings.Contains(out, tok[1]) {
		t.Fatalf("list (exit %d):\n%s", code, out)
	}
	code, _, errOut = runCLI(t, "runner", "token", "revoke", "--sqlite", db, "--id", id[1])
	if code != exitFail || !strings.Contains(errOut, "already used") {
		t.Fatalf("revoke of a used token: exit %d: %s", code, errOut)
	}
	code, _, errOut = runCLI(t, "runner", "disable", "--sqlite", db, "--runner", runner.String(), "--reason", "stolen laptop")
	if code != exitOK {
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
	if code, _, _ := runCLI(t, "runner", "enable", "--sqlite", db, "--runner", runner.String()); code != exitOK {
		t.Fatal("enable failed")
	}
	code, _, errOut = runCLI(t, "runner", "cert", "revoke", "--sqlite", db, "--serial", "abcd")
	if code != exitFail || !strings.Contains(errOut, "not found") {
		t.Fatalf("revoke of an unknown serial: exit %d: %s", code, errOut)
	}
	if code, _, errOut := runCLI(t, "runner", "disable", "--runner", runner.String()); code != exitUsage || !strings.Contains(errOut, "no authority") {
		t.Fatalf("no authority: exit %d: %s", code, errOut)
	}
	if code, _, _ := runCLI(t, "runner", "disable", "--sqlite", db, "--runner", "nope"); code != exitUsage {
		t.Fatal("bad runner id accepted")
	}
}
