package telemetry_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/telemetry"
)

// promtoolPath finds Debian's promtool (package "prometheus").
func promtoolPath(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/promtool"); err == nil {
		return "/usr/bin/promtool"
	}
	t.Fatal("promtool not found: run `apt-get install prometheus` (make deps installs it)")
	return ""
}

// TestPromtoolCheckMetrics lints the scraped exposition with
// `promtool check metrics` (naming, units, counter suffixes, help).
func TestPromtoolCheckMetrics(t *testing.T) {
	promtool := promtoolPath(t)
	m := telemetry.NewMetrics()
	exercise(m)
	text := scrape(t, m.Handler())

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out.String())
	}
	if s := strings.TrimSpace(out.String()); s != "" {
		t.Fatalf("promtool check metrics reported problems:\n%s", s)
	}
}
