package authority_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/wire"
)

// legacySchema is the DDL the authority ran on every open before schema
// versioning (commit cc1b967), frozen here: a database it created must
// upgrade in place.
func legacySchema(b string) []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS fy_runners (
			runner_id ` + b + ` PRIMARY KEY,
			enabled BOOLEAN NOT NULL,
			reason TEXT NOT NULL,
			changed_ms BIGINT NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS fy_sessions (
			session_id ` + b + ` PRIMARY KEY,
			runner_id ` + b + ` NOT NULL,
			epoch BIGINT NOT NULL,
			transport_id ` + b + ` NOT NULL,
			daemon TEXT NOT NULL,
			remote TEXT NOT NULL,
			since_ms BIGINT NOT NULL,
			ended BOOLEAN NOT NULL)`,
		`CREATE INDEX IF NOT EXISTS fy_sessions_runner ON fy_sessions (runner_id)`,
		`CREATE TABLE IF NOT EXISTS fy_leases (
			lease_id ` + b + ` PRIMARY KEY,
			attempt_id ` + b + ` NOT NULL,
			job_id ` + b + ` NOT NULL,
			runner_id ` + b + ` NOT NULL,
			session_id ` + b + ` NOT NULL,
			spec_id ` + b + ` NOT NULL,
			payload ` + b + ` NOT NULL,
			ttl_ms BIGINT NOT NULL,
			expires_ms BIGINT NOT NULL,
			state TEXT NOT NULL,
			cancelled BOOLEAN NOT NULL,
			cancel_reason BIGINT NOT NULL,
			revoke_reason TEXT NOT NULL,
			created_ms BIGINT NOT NULL)`,
		`CREATE INDEX IF NOT EXISTS fy_leases_attempt ON fy_leases (attempt_id)`,
		`CREATE INDEX IF NOT EXISTS fy_leases_session ON fy_leases (session_id)`,
		`CREATE INDEX IF NOT EXISTS fy_leases_expiry ON fy_leases (state, expires_ms)`,
		`CREATE TABLE IF NOT EXISTS fy_completions (
			attempt_id ` + b + ` PRIMARY KEY,
			message_id ` + b + ` NOT NULL,
			lease_id ` + b + ` NOT NULL,
			session_id ` + b + ` NOT NULL,
			result ` + b + ` NOT NULL,
			outputs ` + b + ` NOT NULL,
			recorded_ms BIGINT NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS fy_dedup (
			message_id ` + b + ` PRIMARY KEY,
			op TEXT NOT NULL,
			answer ` + b + ` NOT NULL,
			created_ms BIGINT NOT NULL)`,
		`CREATE INDEX IF NOT EXISTS fy_dedup_created ON fy_dedup (created_ms)`,
		`CREATE TABLE IF NOT EXISTS fy_enroll_tokens (
			token_hash ` + b + ` PRIMARY KEY,
			token_id TEXT NOT NULL UNIQUE,
			name TEXT NOT NULL,
			labels TEXT NOT NULL,
			created_ms BIGINT NOT NULL,
			expires_ms BIGINT NOT NULL,
			used_ms BIGINT NOT NULL,
			runner_id ` + b + ` NOT NULL,
			revoked BOOLEAN NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS fy_certs (
			serial TEXT PRIMARY KEY,
			runner_id ` + b + ` NOT NULL,
			not_after_ms BIGINT NOT NULL,
			issued_ms BIGINT NOT NULL,
			revoked BOOLEAN NOT NULL,
			reason TEXT NOT NULL)`,
		`CREATE INDEX IF NOT EXISTS fy_certs_runner ON fy_certs (runner_id)`,
	}
}

// legacyFixture creates the pre-versioning schema through db and stores one
// registered session in it (raw SQL, as the old code wrote it).
func legacyFixture(t *testing.T, db *sql.DB, blob string, dollar bool) (wire.RunnerId, wire.AgentSessionId) {
	t.Helper()
	ctx := context.Background()
	for _, stmt := range legacySchema(blob) {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("legacy schema: %v", err)
		}
	}
	runner, session := wire.NewRunnerId(), wire.NewAgentSessionId()
	q := `INSERT INTO fy_sessions (session_id, runner_id, epoch, transport_id, daemon, remote, since_ms, ended) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`
	if dollar {
		for i := 1; strings.Contains(q, "?"); i++ {
			q = strings.Replace(q, "?", "$"+string(rune('0'+i)), 1)
		}
	}
	tr := wire.NewTransportSessionId()
	if _, err := db.ExecContext(ctx, q, session.ULID[:], runner.ULID[:], int64(3), tr.ULID[:], "old", "127.0.0.1:1", int64(1), false); err != nil {
		t.Fatalf("legacy row: %v", err)
	}
	return runner, session
}

func schemaVersion(t *testing.T, db *sql.DB) int {
	t.Helper()
	var v int
	if err := db.QueryRow(`SELECT MAX(version) FROM fy_schema_version`).Scan(&v); err != nil {
		t.Fatalf("schema version: %v", err)
	}
	return v
}

// checkUpgraded: the session written by the old code is still there (its
// epoch continues) after the store opened and migrated the database.
func checkUpgraded(t *testing.T, a authority.Authority, runner wire.RunnerId, session wire.AgentSessionId) {
	t.Helper()
	g, err := a.RegisterSession(context.Background(), authority.Registration{Runner: runner, Session: session,
		Transport: wire.NewTransportSessionId(), Now: time.Now()})
	if err != nil || g.Epoch != 4 || g.Previous == nil || g.Previous.Daemon != "old" {
		t.Fatalf("re-register after upgrade = %+v, %v; want epoch 4 continuing the old session", g, err)
	}
}

func TestSchemaUpgradeInPlaceSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "authority.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	runner, session := legacyFixture(t, db, "BLOB", false)
	a := openSQLite(t, path)
	if v := schemaVersion(t, db); v != authority.SchemaVersion() {
		t.Fatalf("schema version after upgrade = %d, want %d", v, authority.SchemaVersion())
	}
	checkUpgraded(t, a, runner, session)
	// Opening again applies nothing.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	openSQLite(t, path)
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM fy_schema_version`).Scan(&n); err != nil || n != authority.SchemaVersion() {
		t.Fatalf("version rows after reopen = %d, %v; want %d", n, err, authority.SchemaVersion())
	}
}

func TestSchemaUpgradeInPlacePostgres(t *testing.T) {
	dsn := pgtest.Shared(t).NewDatabase(t)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	runner, session := legacyFixture(t, db, "BYTEA", true)
	a, err := authority.OpenPostgres(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if v := schemaVersion(t, db); v != authority.SchemaVersion() {
		t.Fatalf("schema version after upgrade = %d, want %d", v, authority.SchemaVersion())
	}
	checkUpgraded(t, a, runner, session)
}

// TestSchemaTooNewRefused: a database migrated by a newer build is refused
// with a message naming both versions; it is left as it was.
func TestSchemaTooNewRefused(t *testing.T) {
	check := func(t *testing.T, err error) {
		t.Helper()
		if !errors.Is(err, authority.ErrSchemaTooNew) {
			t.Fatalf("open newer database: %v; want ErrSchemaTooNew", err)
		}
		want := "schema version 999"
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not say %q", err, want)
		}
		t.Logf("refused: %v", err)
	}
	t.Run("SQLite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "authority.db")
		a := openSQLite(t, path)
		a.Close()
		db, err := sql.Open("sqlite", "file:"+path)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Exec(`INSERT INTO fy_schema_version (version, name, applied_ms) VALUES (999, 'from the future', 0)`); err != nil {
			t.Fatal(err)
		}
		_, err = authority.OpenSQLite(context.Background(), path)
		check(t, err)
	})
	t.Run("Postgres", func(t *testing.T) {
		dsn := pgtest.Shared(t).NewDatabase(t)
		a, err := authority.OpenPostgres(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		a.Close()
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Exec(`INSERT INTO fy_schema_version (version, name, applied_ms) VALUES (999, 'from the future', 0)`); err != nil {
			t.Fatal(err)
		}
		_, err = authority.OpenPostgres(context.Background(), dsn)
		check(t, err)
	})
}
