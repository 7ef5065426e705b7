package authority

import "testing"

// TestMigrationsContiguous: the registered schema steps are numbered 1..N,
// whichever files registered them.
func TestMigrationsContiguous(t *testing.T) {
	steps, err := sortedMigrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) == 0 || schemaVersion() != len(steps) {
		t.Fatalf("schema version %d with %d steps", schemaVersion(), len(steps))
	}
	for _, m := range steps {
		if m.name == "" || len(m.up(sqliteDialect)) == 0 || len(m.up(postgresDialect)) == 0 {
			t.Errorf("migration %d %q has no name or no statements", m.version, m.name)
		}
	}
	saved := migrations
	t.Cleanup(func() { migrations = saved })
	addMigration(len(steps)+2, "gap", func(dialect) []string { return []string{"SELECT 1"} })
	if _, err := sortedMigrations(); err == nil {
		t.Fatal("a gap in the versions was not detected")
	}
	migrations = append(saved[:len(saved):len(saved)], migration{version: 1, name: "dup", up: saved[0].up})
	if _, err := sortedMigrations(); err == nil {
		t.Fatal("a duplicate version was not detected")
	}
}
