package daemonsetup

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/wire"
)

// TestBuild: the start-up steps from a configuration give a daemon.Config
// whose limits are the TOML's ([limits], [admission], [data]), whose
// stores are the configured directories and whose authority is open with
// session-ticket keys installed on the TLS configuration; Close closes the
// authority. A step that fails leaves nothing running.
func TestBuild(t *testing.T) {
	dir := t.TempDir()
	var cfg config.Daemon
	if _, err := DevDaemon(filepath.Join(dir, "pki"), &cfg.TLS); err != nil {
		t.Fatal(err)
	}
	cfg.Listen.QUIC = "127.0.0.1:0"
	cfg.Authority.SQLite = filepath.Join(dir, "authority.db")
	cfg.Data.CASDir, cfg.Data.LogDir = filepath.Join(dir, "cas"), filepath.Join(dir, "logs")
	cfg.Limits.MaxStreams = 77
	cfg.Admission.MaxHandshakes = 33
	cfg.Data.CASMaxPerConn = 3
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	b, err := Build(context.Background(), &cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	l := b.Config.AllLimits()
	if l.Conn.MaxStreams != 77 || l.Admission.MaxHandshakes != 33 || l.Data.CASMaxPerConn != 3 {
		t.Errorf("limits %+v: want the TOML's 77, 33 and 3", l)
	}
	if b.Config.Authority != b.Authority || b.Config.ContentStore == nil || b.Config.LogDir != cfg.Data.LogDir || b.Config.RunnerCAs == nil {
		t.Errorf("config: authority %v (built %v), content store %v, log dir %q, runner CAs %v", b.Config.Authority, b.Authority, b.Config.ContentStore, b.Config.LogDir, b.Config.RunnerCAs)
	}
	if b.TLS.WrapSession == nil || b.TLS.UnwrapSession == nil {
		t.Error("no session tickets installed on the TLS configuration")
	}
	if _, err := b.Authority.RunnerStatus(context.Background(), wire.NewRunnerId()); err != nil {
		t.Fatalf("authority not usable before Close: %v", err)
	}
	b.Close()
	if _, err := b.Authority.RunnerStatus(context.Background(), wire.NewRunnerId()); err == nil {
		t.Error("authority usable after Close")
	}

	// A later step fails (the authority's path is a directory): the
	// certificate reload started by the first step is stopped again.
	opts := []goleak.Option{goleak.IgnoreCurrent()}
	bad := cfg
	bad.Authority.SQLite = dir
	if _, err := Build(context.Background(), &bad, log); err == nil {
		t.Fatal("Build with a directory as the SQLite authority succeeded")
	}
	goleak.VerifyNone(t, opts...)
}
