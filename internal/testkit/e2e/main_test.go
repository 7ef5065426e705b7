//go:build linux

package e2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"forgeyard.dev/transport/internal/testkit/binaries"
	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/internal/testkit/s3test"
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
	defer binaries.Cleanup()
	bins, err := binaries.BuildErr("forgeyard-daemon", "forgeyard-agent", "forgeyard-relay")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: building the binaries: %v\n", err)
		return 1
	}
	binDaemon, binAgent, binRelay = bins[0], bins[1], bins[2]
	// The HA scenario's PostgreSQL and versitygw, if it started them.
	defer pgtest.StopShared()
	defer s3test.StopShared()
	return m.Run()
}
