package daemon_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/internal/testkit/s3test"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	s3test.StopShared()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreCurrent(),
			goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
			goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
