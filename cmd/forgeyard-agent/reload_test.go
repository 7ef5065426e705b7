package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/daemon"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// TestSIGHUPReloadsCapabilities: the agent main re-reads its configuration
// on SIGHUP and sends the daemon the new capability snapshot
// (CapabilityUpdateV1, §94) without reconnecting; an invalid reload keeps
// the running capabilities.
func TestSIGHUPReloadsCapabilities(t *testing.T) {
	dir := t.TempDir()
	pkiDir := filepath.Join(dir, "pki")
	caps := make(chan []string, 8)
	addr := fastHeartbeatDaemon(t, pkiDir, daemon.Hooks{OnCapabilities: func(_ daemon.SessionInfo, c agentwire.RunnerCapabilitiesV1) {
		caps <- slices.Clone(c.Labels)
	}})
	conf := filepath.Join(dir, "agent.toml")
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("[capabilities]\nlabels = [\"linux\", \"small\"]\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	installed := make(chan struct{}, 1)
	reloaded := make(chan bool, 4)
	var logs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--config", conf, "--dev-pki", pkiDir, "--endpoint", "quic://" + addr, "--server-name", "localhost", "--log-format", "json"},
			io.Discard, &logs, &testHooks{sighup: func() { installed <- struct{}{} }, reloaded: func(changed bool, err error) { reloaded <- changed && err == nil }})
	}()
	defer func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("agent logs:\n%s", logs.String())
		}
	}()
	next := func(what string) []string {
		t.Helper()
		select {
		case l := <-caps:
			return l
		case code := <-done:
			t.Fatalf("agent exited %d", code)
		case <-time.After(10 * time.Second):
			t.Fatalf("no capabilities %s", what)
		}
		return nil
	}
	if got := next("at registration"); !slices.Equal(got, []string{"linux", "small"}) {
		t.Fatalf("registered with labels %v", got)
	}
	<-installed
	write("[capabilities]\nlabels = [\"linux\", \"big\", \"gpu\"]\n")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if ok := <-reloaded; !ok {
		t.Fatal("the reload reported no change")
	}
	if got := next("after SIGHUP"); !slices.Equal(got, []string{"linux", "big", "gpu"}) {
		t.Fatalf("update carried labels %v", got)
	}
	// An invalid file: reported, nothing sent.
	write("[capabilities]\nlabels = [\"\"]\n")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if ok := <-reloaded; ok {
		t.Fatal("an invalid reload was applied")
	}
	select {
	case l := <-caps:
		t.Fatalf("an invalid reload sent labels %v", l)
	default:
	}
}
