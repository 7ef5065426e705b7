// Package binaries builds the module's commands for tests that run them as
// real processes (the e2e scenarios, the CLI and daemon process tests, the
// loadgen's started daemon): one `go build` for all that are missing, once
// per test binary, into one directory that Cleanup removes.
//
// A test that needs forgeyard-daemon calls
//
//	bin := binaries.Build(t, "forgeyard-daemon")[0]
//
// and the package's TestMain calls binaries.Cleanup after m.Run.
package binaries

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// module is the import path prefix of the commands (cmd/<name>).
const module = "forgeyard.dev/transport/cmd/"

// buildTimeout bounds one go build (a cold build cache on a loaded machine
// takes a minute or two).
const buildTimeout = 5 * time.Minute

var (
	mu    sync.Mutex
	dir   string
	built = map[string]string{} // command name → path
)

// Build returns the paths of the named commands (e.g. "forgeyard-daemon"),
// in order, building those not built yet by this test binary. A failed
// build fails tb with the compiler's output.
func Build(tb testing.TB, cmds ...string) []string {
	tb.Helper()
	paths, err := BuildErr(cmds...)
	if err != nil {
		tb.Fatal(err)
	}
	return paths
}

// BuildErr is Build for callers without a testing.TB (a TestMain).
func BuildErr(cmds ...string) ([]string, error) {
	mu.Lock()
	defer mu.Unlock()
	if dir == "" {
		d, err := os.MkdirTemp("", "forgeyard-bin-")
		if err != nil {
			return nil, fmt.Errorf("binaries: %w", err)
		}
		dir = d
	}
	var missing []string
	for _, c := range cmds {
		if _, ok := built[c]; !ok {
			missing = append(missing, module+c)
		}
	}
	if len(missing) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, goTool(), append([]string{"build", "-o", dir + string(filepath.Separator)}, missing...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("binaries: go build %v: %v\n%s", missing, err, out)
		}
		for _, c := range cmds {
			built[c] = filepath.Join(dir, c)
		}
	}
	paths := make([]string, len(cmds))
	for i, c := range cmds {
		paths[i] = built[c]
	}
	return paths, nil
}

// Cleanup removes the binaries built so far (call it from TestMain after
// m.Run).
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	if dir != "" {
		_ = os.RemoveAll(dir)
	}
	dir, built = "", map[string]string{}
}

// goTool is the go command: on PATH, else under GOROOT.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(os.Getenv("GOROOT"), "bin", "go")
}
