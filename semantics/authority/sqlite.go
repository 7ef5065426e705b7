package authority

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"

	_ "modernc.org/sqlite" // database/sql driver "sqlite"
)

// OpenSQLite opens (creating if needed) the embedded authority in one SQLite
// file at path. Use ":memory:" for a throwaway store. The store survives a
// daemon restart: reopening the same file sees every lease, session and
// completion. Writes are serialized through a single connection (SQLite has
// one writer anyway), in WAL mode with a busy timeout.
//
// Durability: synchronous=FULL, so every commit fsyncs the WAL before it
// returns. With NORMAL (SQLite's usual WAL setting) a power loss or kernel
// crash can roll back the last transactions, including completions the
// daemon already acknowledged to an agent; the protocol's exactly-once
// promise needs an acknowledged completion to stay.
//
// A new database file is created readable and writable by its owner only
// (0600): SQLite creates the -wal and -shm files with the database file's
// mode, so they are 0600 too. An existing file keeps its mode.
func OpenSQLite(ctx context.Context, path string) (Authority, error) {
	s, err := openSQLite(ctx, path, 1)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// openSQLite opens the store with the given number of group-commit workers
// (0: every operation in its own transaction, for the benchmark's
// comparison).
func openSQLite(ctx context.Context, path string, workers int) (*store, error) {
	if path != ":memory:" {
		if err := createPrivate(path); err != nil {
			return nil, fmt.Errorf("authority: open sqlite %q: %w", path, err)
		}
	}
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() +
		"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=foreign_keys(ON)&_txlock=immediate"
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
	s, err := newStore(ctx, db, db, sqliteDialect, workers)
	if err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// createPrivate creates path as an empty file with mode 0600 if it does not
// exist (an empty file is an empty SQLite database). SQLite itself would
// create it 0644 (less the umask).
func createPrivate(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return f.Close()
}
