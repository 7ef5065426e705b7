package deptest

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

// TestModTidy fails when go.mod or go.sum is not what `go mod tidy` would
// write: a direct dependency marked "// indirect", a module nothing imports,
// a missing checksum. The fix it prints is the command to run.
func TestModTidy(t *testing.T) {
	if testing.Short() {
		t.Skip("go mod tidy -diff resolves the whole module graph; not in -short")
	}
	cmd := exec.Command("go", "mod", "tidy", "-diff")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err == nil && stdout.Len() == 0 {
		return
	}
	if _, ok := err.(*exec.ExitError); !ok && err != nil {
		t.Fatalf("go mod tidy -diff: %v\n%s", err, stderr.String())
	}
	t.Errorf("go.mod/go.sum are not tidy; run `go mod tidy` and commit the result:\n%s%s",
		stdout.String(), lastLines(stderr.String(), 5))
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
