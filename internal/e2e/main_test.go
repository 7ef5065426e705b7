//go:build linux

package e2e

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"forgeyard.dev/transport/internal/pgtest"
	"forgeyard.dev/transport/internal/s3test"
)

// The binaries built by TestMain.
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
	pkgs := []string{"forgeyard.dev/transport/cmd/forgeyard-daemon", "forgeyard.dev/transport/cmd/forgeyard-agent",
		"forgeyard.dev/transport/cmd/forgeyard-relay"}
	cmd := exec.Command("go", append([]string{"build", "-o", dir + "/"}, pkgs...)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: building the binaries: %v\n", err)
		return 1
	}
	binDaemon, binAgent, binRelay = filepath.Join(dir, "forgeyard-daemon"), filepath.Join(dir, "forgeyard-agent"), filepath.Join(dir, "forgeyard-relay")
	// The HA scenario's PostgreSQL and versitygw, if it started them.
	defer pgtest.StopShared()
	defer s3test.StopShared()
	return m.Run()
}
