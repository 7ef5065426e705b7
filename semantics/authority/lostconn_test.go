package authority_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/wire"
)

// TestWriteAfterConnectionsEnded: the server ends every pooled connection
// of a handle (pg_terminate_backend, what a PostgreSQL restart does to
// them: FATAL 57P01), and the next writes — alone and batched — succeed on
// fresh connections instead of failing on the dead ones. A transaction
// whose connection was lost before its Commit was rolled back by the
// server, so running it again applies it once.
func TestWriteAfterConnectionsEnded(t *testing.T) {
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	dsn := srv.NewDatabase(t)
	a, err := authority.OpenPostgres(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	ctx := context.Background()
	register := func(n int) []wire.RunnerId {
		runners := make([]wire.RunnerId, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range runners {
			runners[i] = wire.NewRunnerId()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = a.RegisterSession(ctx, authority.Registration{Runner: runners[i], Session: wire.NewAgentSessionId(),
					Transport: wire.NewTransportSessionId(), Now: time.Now()})
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("RegisterSession %d of %d: %v", i+1, n, err)
			}
		}
		return runners
	}
	register(16) // fills the handle's pool with idle connections

	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	admin.SetMaxOpenConns(1)
	others := `FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`
	endConns := func() {
		t.Helper()
		var ended int
		if err := admin.QueryRowContext(ctx, `SELECT count(pg_terminate_backend(pid)) `+others).Scan(&ended); err != nil {
			t.Fatal(err)
		}
		if ended == 0 {
			t.Fatal("the handle held no idle connection to end")
		}
		for left := 1; left > 0; {
			if err := admin.QueryRowContext(ctx, `SELECT count(*) `+others).Scan(&left); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("ended %d pooled connections", ended)
	}
	endConns()
	// Reads outside a transaction, at once: the clock and a drain state.
	if _, err := authority.ClockOf(a).DatabaseNow(ctx); err != nil {
		t.Fatalf("DatabaseNow on ended connections: %v", err)
	}
	if _, err := authority.InventoryOf(a).DrainState(ctx, wire.NewRunnerId()); err != nil {
		t.Fatalf("DrainState on ended connections: %v", err)
	}
	register(4) // the pool holds idle connections again
	endConns()

	// At once (pgx pings an idle connection only after a second): one write
	// alone, then a batch.
	register(1)
	register(16)
}
