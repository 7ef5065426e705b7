//go:build unix

package authority_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/wire"
)

// TestSQLiteFileModes: a new authority database and its -wal and -shm files
// are readable by their owner only, under the common umask 022 (with which
// SQLite's own default would give 0644); an existing file keeps its mode.
func TestSQLiteFileModes(t *testing.T) {
	old := syscall.Umask(0o022)
	t.Cleanup(func() { syscall.Umask(old) })
	dir := t.TempDir()
	path := filepath.Join(dir, "authority.db")
	a := openSQLite(t, path)
	// A write, so the WAL and its shared-memory index exist.
	ctx := context.Background()
	if _, err := a.RegisterSession(ctx, authority.Registration{Runner: wire.NewRunnerId(), Session: wire.NewAgentSessionId(),
		Transport: wire.NewTransportSessionId(), Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"authority.db", "authority.db-wal", "authority.db-shm"} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %#o, want 0600", name, st.Mode().Perm())
		}
	}

	// A database the operator created with another mode keeps it.
	other := filepath.Join(dir, "shared.db")
	if err := os.WriteFile(other, nil, 0o640); err != nil {
		t.Fatal(err)
	}
	openSQLite(t, other)
	if st, err := os.Stat(other); err != nil || st.Mode().Perm() != 0o640 {
		t.Fatalf("existing database mode = %v, %v; want 0640 kept", st, err)
	}
}
