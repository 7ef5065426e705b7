package daemonsetup

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/serversetup"
)

func TestListenAndAuthority(t *testing.T) {
	dir := t.TempDir()
	var stls config.ServerTLS
	if _, err := DevDaemon(filepath.Join(dir, "pki"), &stls); err != nil {
		t.Fatal(err)
	}
	srv, err := serversetup.ServerTLS(stls)
	if err != nil {
		t.Fatal(err)
	}
	lns, err := serversetup.Listen(config.Listen{QUIC: "127.0.0.1:0", Yamux: "127.0.0.1:0"}, srv, quic.Config{}, yamux.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if len(lns) != 2 || lns[0].Backend != config.BackendQUIC || lns[1].Backend != config.BackendYamux {
		t.Fatalf("listeners %+v", lns)
	}
	for _, l := range lns {
		l.Close()
	}
	if _, err := serversetup.Listen(config.Listen{QUIC: "127.0.0.1:0", Yamux: "256.0.0.1:1"}, srv, quic.Config{}, yamux.Config{}); err == nil || !strings.Contains(err.Error(), "listen.yamux") {
		t.Errorf("bad yamux address: %v", err)
	}

	ctx := context.Background()
	au, err := OpenAuthority(ctx, config.AuthorityConfig{SQLite: filepath.Join(dir, "a.db")})
	if err != nil {
		t.Fatal(err)
	}
	au.Close()
	dsn := filepath.Join(dir, "pg.dsn")
	os.WriteFile(dsn, []byte("postgres://u:hunter2@127.0.0.1:1/db?connect_timeout=1\n"), 0o600)
	_, err = OpenAuthority(ctx, config.AuthorityConfig{PostgresDSNFile: dsn})
	if err == nil {
		t.Fatal("postgres on port 1 opened")
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error leaks the DSN password: %v", err)
	}
	if _, err := OpenAuthority(ctx, config.AuthorityConfig{PostgresDSNFile: filepath.Join(dir, "missing")}); err == nil || !strings.Contains(err.Error(), "postgres_dsn_file") {
		t.Errorf("missing dsn file: %v", err)
	}
}
