package authority

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"time"
)

// Schema versioning. The authority's tables are created and changed by an
// ordered list of migrations, each applied once in its own transaction and
// recorded in fy_schema_version (one row per applied step). Opening a store
// applies the steps the database lacks; a database whose version is newer
// than the newest step this build knows is refused (ErrSchemaTooNew), since
// an older daemon could misread or corrupt tables it does not know.
//
// Adding a step: in the file that owns the new tables, register it from an
// init function with the next free version number,
//
//	func init() { addMigration(2, "capabilities and drain", rolesSchema) }
//
// where rolesSchema(d dialect) []string returns the statements (d.blob is the
// binary column type; switch on d.name for dialect-specific SQL). Never edit
// or renumber a released step: a database that already has it will not run
// it again. Versions must be 1..N without gaps (TestMigrationsContiguous).
//
// Version 1 is the schema as it was before versioning, with IF NOT EXISTS:
// a database created by that code has no fy_schema_version table, and
// applying step 1 to it creates nothing and records version 1, so it upgrades
// in place with its data.

// ErrSchemaTooNew: the database was migrated by a newer build than this one.
var ErrSchemaTooNew = errors.New("authority: database schema is newer than this build")

// migration is one schema step.
type migration struct {
	version int
	name    string
	up      func(d dialect) []string
}

var migrations []migration

// addMigration registers a schema step (from an init function).
func addMigration(version int, name string, up func(d dialect) []string) {
	migrations = append(migrations, migration{version: version, name: name, up: up})
}

func init() {
	addMigration(1, "base: runners, sessions, leases, completions, dedup, enrollment tokens, certificates",
		func(d dialect) []string { return append(baseSchema(d), identitySchema(d)...) })
}

// sortedMigrations returns the registered steps by version and checks they
// are numbered 1..N.
func sortedMigrations() ([]migration, error) {
	ms := append([]migration(nil), migrations...)
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	for i, m := range ms {
		if m.version != i+1 {
			return nil, fmt.Errorf("authority: schema migrations are not numbered 1..%d without gaps or duplicates (found version %d at position %d)", len(ms), m.version, i+1)
		}
	}
	return ms, nil
}

// schemaVersion is the newest version this build knows.
func schemaVersion() int {
	ms, err := sortedMigrations()
	if err != nil {
		return 0
	}
	return len(ms)
}

type beginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

const versionTable = `CREATE TABLE IF NOT EXISTS fy_schema_version (
	version BIGINT PRIMARY KEY,
	name TEXT NOT NULL,
	applied_ms BIGINT NOT NULL)`

// migrate applies the steps the database lacks through ex: the pool (SQLite,
// whose BEGIN IMMEDIATE serializes openers of one file) or one connection
// holding an advisory lock (PostgreSQL, so daemons starting together do not
// race on the catalog). The current version is read inside each step's
// transaction, so a concurrent opener that applied the step first is seen.
func (s *store) migrate(ctx context.Context, ex beginner) error {
	steps, err := sortedMigrations()
	if err != nil {
		return err
	}
	fail := func(what string, err error) error {
		return fmt.Errorf("authority(%s): %s: %w", s.d.name, what, err)
	}
	for _, m := range steps {
		t, err := ex.BeginTx(ctx, nil)
		if err != nil {
			return fail("migrate schema", err)
		}
		cur, err := s.versionIn(ctx, t)
		if err != nil {
			_ = t.Rollback()
			return fail("read schema version", err)
		}
		if cur > len(steps) {
			_ = t.Rollback()
			return fmt.Errorf("%w: the database is at schema version %d, this build knows versions up to %d; "+
				"run the forgeyard-daemon release that migrated it (or newer), or restore a backup taken before the upgrade",
				ErrSchemaTooNew, cur, len(steps))
		}
		if cur >= m.version {
			_ = t.Rollback()
			continue
		}
		for _, stmt := range m.up(s.d) {
			if _, err := t.ExecContext(ctx, stmt); err != nil {
				_ = t.Rollback()
				return fail(fmt.Sprintf("schema migration %d (%s)", m.version, m.name), err)
			}
		}
		if _, err := t.ExecContext(ctx, s.rebind(`INSERT INTO fy_schema_version (version, name, applied_ms) VALUES (?, ?, ?)`),
			int64(m.version), m.name, ms(time.Now())); err != nil {
			_ = t.Rollback()
			return fail(fmt.Sprintf("record schema version %d", m.version), err)
		}
		if err := t.Commit(); err != nil {
			return fail(fmt.Sprintf("commit schema migration %d", m.version), err)
		}
	}
	return nil
}

// versionIn creates the version table if needed and returns the database's
// schema version (0: none recorded, an empty or pre-versioning database).
func (s *store) versionIn(ctx context.Context, t *sql.Tx) (int, error) {
	if _, err := t.ExecContext(ctx, versionTable); err != nil {
		return 0, err
	}
	var v sql.NullInt64
	if err := t.QueryRowContext(ctx, `SELECT MAX(version) FROM fy_schema_version`).Scan(&v); err != nil {
		return 0, err
	}
	return int(v.Int64), nil
}

// baseSchema is migration 1's transport tables (identitySchema has the rest).
// The CREATE TABLE texts here, in identitySchema and in inventorySchema
// look alike column by column but each is its own table's DDL, written out
// whole: a migration step's statements must never change once released.
func baseSchema(d dialect) []string {
	b := d.blob
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
	}
}
