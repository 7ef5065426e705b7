package authority_test

import (
	"context"
	"path/filepath"
	"testing"

	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/authority/authoritytest"
)

func TestSQLiteInventory(t *testing.T) {
	var path string
	authoritytest.RunInventory(t, authoritytest.Opener{
		Open: func(t *testing.T) authority.Authority {
			path = filepath.Join(t.TempDir(), "authority.db")
			return openSQLite(t, path)
		},
		// A second handle on the same file (one host, two processes).
		Shared: func(t *testing.T) authority.Authority { return openSQLite(t, path) },
	})
}

func TestPostgresInventory(t *testing.T) {
	srv := pgtest.Shared(t)
	var dsn string
	open := func(t *testing.T) authority.Authority {
		a, err := authority.OpenPostgres(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		return a
	}
	authoritytest.RunInventory(t, authoritytest.Opener{
		Open: func(t *testing.T) authority.Authority {
			dsn = srv.NewDatabase(t)
			return open(t)
		},
		Shared: open,
	})
}

func TestInventorySchemaExported(t *testing.T) {
	for _, d := range []string{"sqlite", "postgres"} {
		if n := len(authority.InventorySchema(d)); n != 4 {
			t.Errorf("%s: %d statements, want 4", d, n)
		}
	}
}
