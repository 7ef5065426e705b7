package authority

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"

	_ "modernc.org/sqlite" // database/sql driver "sqlite"
)

// OpenSQLite opens (creating if needed) the embedded authority in one SQLite
// file at path. Use ":memory:" for a throwaway store. The store survives a
// daemon restart: reopening the same file sees every lease, session and
// completion. Writes are serialized through a single connection (SQLite has
// one writer anyway), in WAL mode with a busy timeout.
func OpenSQLite(ctx context.Context, path string) (Authority, error) {
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() +
		"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(ON)&_txlock=immediate"
	if path == ":memory:" {
		dsn = "file::memory:?_txlock=immediate"
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("authority: open sqlite %q: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("authority: open sqlite %q: %w", path, err)
	}
	s, err := newStore(ctx, db, db, sqliteDialect)
	if err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}
