package authority

import (
	"context"
	"path/filepath"
	"testing"
)

// TestSQLiteSynchronousFull: the store's connection commits with
// synchronous=FULL (2), so an acknowledged completion survives a power loss.
// PRAGMA synchronous is per connection; the store has exactly one.
func TestSQLiteSynchronousFull(t *testing.T) {
	a, err := OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "authority.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	s := a.(*store)
	var sync, journal = 0, ""
	if err := s.db.QueryRow(`PRAGMA synchronous`).Scan(&sync); err != nil {
		t.Fatal(err)
	}
	if err := s.db.QueryRow(`PRAGMA journal_mode`).Scan(&journal); err != nil {
		t.Fatal(err)
	}
	if sync != 2 || journal != "wal" {
		t.Fatalf("PRAGMA synchronous = %d, journal_mode = %q; want 2 (FULL) and wal", sync, journal)
	}
}
