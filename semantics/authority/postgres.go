package authority

import (
	"context"
	"database/sql"
	"fmt"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

// pgBatchWorkers is how many group-commit batches one store runs at once
// (batcher.go), each on its own connection: one batch commits (waits for
// its WAL flush) while the next runs its statements.
const pgBatchWorkers = 4

// OpenPostgres opens the shared authority in the PostgreSQL database named by
// dsn (a libpq URL or key=value string) and creates its tables if needed.
// Several daemons may open the same database at once: every operation runs in
// a transaction with row locks, so an agent can resync on any of them
// (§227–230).
func OpenPostgres(ctx context.Context, dsn string) (Authority, error) {
	s, err := openPostgres(ctx, dsn, pgBatchWorkers)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func openPostgres(ctx context.Context, dsn string, workers int) (*store, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("authority: open postgres: %w", err)
	}
	db.SetMaxOpenConns(16)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("authority: connect to postgres: %w", err)
	}
	// Creating the schema concurrently from several daemons can race on the
	// catalog; serialize it with a session-level advisory lock held on one
	// connection.
	conn, err := db.Conn(ctx)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("authority: connect to postgres: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock(74657265)`); err != nil {
		db.Close()
		return nil, fmt.Errorf("authority: postgres schema lock: %w", err)
	}
	s, err := newStore(ctx, db, conn, postgresDialect, workers)
	_, _ = conn.ExecContext(ctx, `SELECT pg_advisory_unlock(74657265)`)
	if err != nil {
		db.Close()
		return nil, err
	}
	s.dsn = dsn
	return s, nil
}
