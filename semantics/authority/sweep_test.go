package authority_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics/authority"
)

func leader(t *testing.T, a authority.Authority) bool {
	t.Helper()
	el, ok := a.(authority.SweepElector)
	if !ok {
		t.Fatalf("%T is not a SweepElector", a)
	}
	lead, err := el.SweepLeader(context.Background())
	if err != nil {
		t.Fatalf("SweepLeader: %v", err)
	}
	return lead
}

// TestSweepLeaderElected: of two daemons sharing PostgreSQL exactly one is
// the sweep leader; it stays leader, and when it stops, or its database
// session is killed, the other takes over.
func TestSweepLeaderElected(t *testing.T) {
	dsn := pgtest.Shared(t).NewDatabase(t)
	open := func() authority.Authority {
		a, err := authority.OpenPostgres(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		return a
	}
	a, b := open(), open()
	if !leader(t, a) || leader(t, b) || !leader(t, a) || leader(t, b) {
		t.Fatal("want a leader and b not, repeatedly")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if !leader(t, b) {
		t.Fatal("b did not take over after a stopped")
	}
	// The leader's database session dies (a crashed daemon, a restarted
	// pooler): the lock goes with it, and the next to ask leads.
	c := open()
	if leader(t, c) {
		t.Fatal("c leads while b does")
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var pid int
	if err := db.QueryRow(`SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = 74657266 AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&pid); err != nil {
		t.Fatalf("the leader's lock: %v", err)
	}
	if _, err := db.Exec(`SELECT pg_terminate_backend($1, 10000)`, pid); err != nil {
		t.Fatalf("terminate the leader's session: %v", err)
	}
	if !leader(t, c) {
		t.Fatal("c did not take over after b's session was killed")
	}
	if leader(t, b) {
		t.Fatal("b still claims to lead after losing its session")
	}
}

func TestSweepLeaderSQLite(t *testing.T) {
	if !leader(t, openSQLite(t, filepath.Join(t.TempDir(), "authority.db"))) {
		t.Fatal("the embedded store's only daemon must lead")
	}
}
