//go:build linux

package e2e

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// bins holds the binaries built by TestMain; binRelay is "" when the
// module has no cmd/forgeyard-relay yet.
var binDaemon, binAgent, binRelay string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		return m.Run() // every scenario skips with the reason
	}
	dir, err := os.MkdirTemp("", "fy-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	pkgs := []string{"forgeyard.dev/transport/cmd/forgeyard-daemon", "forgeyard.dev/transport/cmd/forgeyard-agent"}
	if _, err := os.Stat("../../cmd/forgeyard-relay"); err == nil {
		pkgs = append(pkgs, "forgeyard.dev/transport/cmd/forgeyard-relay")
		binRelay = filepath.Join(dir, "forgeyard-relay")
	}
	cmd := exec.Command("go", append([]string{"build", "-o", dir + "/"}, pkgs...)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: building the binaries: %v\n", err)
		return 1
	}
	binDaemon, binAgent = filepath.Join(dir, "forgeyard-daemon"), filepath.Join(dir, "forgeyard-agent")
	return m.Run()
}
