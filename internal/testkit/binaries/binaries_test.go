package binaries

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestBuildOnce: the first Build compiles the command into the shared
// directory, a second returns the same path without building again (the
// file is the same one), the binary runs, and Cleanup removes it.
func TestBuildOnce(t *testing.T) {
	p := Build(t, "forgeyard-protocol-inspect")[0]
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	again := Build(t, "forgeyard-protocol-inspect")[0]
	st2, err := os.Stat(again)
	if err != nil || again != p || !os.SameFile(st, st2) || !st2.ModTime().Equal(st.ModTime()) {
		t.Fatalf("second Build = %s (%v), want the first build %s untouched", again, err, p)
	}
	out, err := exec.Command(p, "--help").CombinedOutput()
	if !strings.Contains(string(out), "forgeyard-protocol-inspect") {
		t.Fatalf("%s --help: %v\n%s", p, err, out)
	}
	Cleanup()
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("after Cleanup: %v, want the binary gone", err)
	}
}

// TestBuildError: a command that does not exist is an error naming it.
func TestBuildError(t *testing.T) {
	defer Cleanup()
	_, err := BuildErr("forgeyard-no-such-command")
	if err == nil || !strings.Contains(err.Error(), "forgeyard-no-such-command") {
		t.Fatalf("BuildErr(no such command) = %v", err)
	}
}
