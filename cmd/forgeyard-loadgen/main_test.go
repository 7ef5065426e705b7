package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/config"
)

// TestPrepare: prepare writes a daemon configuration the daemon's own
// loader accepts (listeners, the dev PKI's files, the heartbeat), and a
// second run reads the runners from the cache.
func TestPrepare(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	args := []string{"prepare", "--dir", dir, "--n", "5", "--heartbeat", "3s", "--listen", "127.0.0.1:17443", "--listen-webtransport", ""}
	if code := run(context.Background(), args, &out, &errb); code != cli.ExitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "5 runner certificates generated") {
		t.Errorf("output: %s", out.String())
	}
	cfg, err := config.LoadDaemon(filepath.Join(dir, "daemon.toml"))
	if err != nil {
		t.Fatalf("daemon.toml: %v", err)
	}
	if cfg.Listen.QUIC != "127.0.0.1:17443" || cfg.Listen.Yamux != "127.0.0.1:7444" || cfg.Listen.WebTransport != "" ||
		cfg.Timing.HeartbeatInterval.Duration != 3*time.Second || cfg.TLS.ClientCA == "" || cfg.Authority.SQLite == "" {
		t.Errorf("daemon.toml: %+v", cfg)
	}
	for _, f := range []string{cfg.TLS.Certificate, cfg.TLS.PrivateKey, cfg.TLS.ClientCA} {
		if _, err := os.Stat(f); err != nil {
			t.Error(err)
		}
	}
	out.Reset()
	if code := run(context.Background(), args, &out, &errb); code != cli.ExitOK || !strings.Contains(out.String(), "read from the cache") {
		t.Errorf("second prepare: exit %d: %s", code, out.String())
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{"frobnicate"},
		{"run", "--n", "5"}, // neither --spawn-daemon nor a daemon to attach to
		{"run", "--bogus"},
		{"ladder", "--ladder", "tcp:10"},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb); code != cli.ExitUsage {
			t.Errorf("%v: exit %d, want %d (%s)", args, code, cli.ExitUsage, errb.String())
		}
	}
}
