// Package metricstest checks Prometheus expositions with the real promtool
// (Debian's prometheus package, installed by make deps) and saves endpoint
// samples for the docs, for the tests of every role that serves /metrics.
package metricstest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// PromtoolCheck fails tb unless `promtool check metrics` accepts text
// without a single complaint (lint findings included).
func PromtoolCheck(tb testing.TB, text string) {
	tb.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		p = "/usr/bin/promtool"
		if _, err := os.Stat(p); err != nil {
			tb.Fatal("promtool not found: run `apt-get install prometheus` (make deps installs it)")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, p, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		tb.Fatalf("promtool check metrics: %v\n%s", err, out.String())
	}
	if s := strings.TrimSpace(out.String()); s != "" {
		tb.Fatalf("promtool check metrics reported problems:\n%s", s)
	}
}

// WriteSample saves an endpoint's output as name under
// $FORGEYARD_SAMPLES_DIR (unset: nothing), for docs/operations.md.
func WriteSample(tb testing.TB, name, body string) {
	tb.Helper()
	if d := os.Getenv("FORGEYARD_SAMPLES_DIR"); d != "" {
		if err := os.WriteFile(filepath.Join(d, name), []byte(body), 0o644); err != nil {
			tb.Error(err)
		}
	}
}
