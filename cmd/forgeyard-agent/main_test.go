package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/daemonsetup"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

func TestHelp(t *testing.T) {
	var o, e bytes.Buffer
	if code := run(context.Background(), []string{"-h"}, &o, &e, nil); code != cli.ExitOK {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"-config", "-endpoint", "quic://", "yamux://", "webtransport://", "-cert", "-key", "-ca", "-server-name", "-dev-pki", "-log-level", "synthetic", "-status-file", "-status-interval", "-metrics-listen", "connection status", "forgeyard-agent doctor"} {
		if !strings.Contains(o.String(), want) {
			t.Errorf("help lacks %q", want)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "agent.toml")
	os.WriteFile(cfg, []byte("[control_plane]\nendpoints = [\"gopher://x\"]\n"), 0o600)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--nope"}, "flag provided but not defined"},
		{[]string{"--dev-pki", filepath.Join(dir, "pki")}, "control_plane.endpoints: required"},
		{[]string{"--config", cfg}, "agent.toml: control_plane.endpoints[0]"},
		{[]string{"--endpoint", "quic://h", "--cert", "a.pem", "--key", "k.pem"}, "control_plane.credential.ca: required"},
		{[]string{"--endpoint", "quic://h", "--cert", "a.pem", "--key", "k.pem", "--ca", "ca.pem"}, `control_plane.credential.certificate "a.pem"`},
		{[]string{"--dev-pki", filepath.Join(dir, "pki"), "--endpoint", "quic://h", "--protocol", "2.0-1.0"}, "--protocol: protocol range"},
		{[]string{"--dev-pki", filepath.Join(dir, "pki"), "--endpoint", "quic://h", "--synthetic-output-size", "-2"}, "--synthetic-output-size must be"},
	} {
		var o, e bytes.Buffer
		code := run(context.Background(), c.args, &o, &e, nil)
		if code != cli.ExitUsage || !strings.Contains(e.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 with %q", c.args, code, e.String(), c.want)
		}
	}
}

// testDaemon is a daemon on QUIC loopback built from semantics/daemon.
func testDaemon(t *testing.T, backend, pkiDir string, hooks daemon.Hooks, log io.Writer) (*daemon.Daemon, string) {
	t.Helper()
	var stls config.ServerTLS
	if _, err := daemonsetup.DevDaemon(pkiDir, &stls); err != nil {
		t.Fatal(err)
	}
	tc, err := serversetup.ServerTLS(stls)
	if err != nil {
		t.Fatal(err)
	}
	au, err := authority.OpenSQLite(context.Background(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	d, err := daemon.New(daemon.Config{Authority: au, Hooks: hooks, Logger: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	var ln semantics.BackendListener
	if backend == "yamux" {
		ln, err = yamux.Listen("127.0.0.1:0", tc, yamux.Config{})
	} else {
		ln, err = quic.Listen("127.0.0.1:0", tc, quic.Config{})
	}
	if err != nil {
		t.Fatal(err)
	}
	go d.Serve(context.Background(), ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.Shutdown(ctx)
		ln.Close()
		au.Close()
	})
	return d, ln.Addr().String()
}

// TestAgent runs the agent main in-process against a daemon over QUIC and
// over TLS+yamux: it registers with its dev certificate's RunnerId, runs an
// offered lease with the synthetic executor, and exits 0 on SIGINT (ctx
// cancel).
func TestAgent(t *testing.T) {
	for _, b := range []string{"quic", "yamux"} {
		t.Run(b, func(t *testing.T) { testAgent(t, b) })
	}
}

func testAgent(t *testing.T, backend string) {
	pkiDir := filepath.Join(t.TempDir(), "pki")
	pki, err := trust.GenerateDevPKI(pkiDir, trust.DevPKIOptions{Agents: []string{"builder"}})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := pki.Agent("builder")
	registered := make(chan daemon.SessionInfo, 4)
	completed := make(chan daemon.CompletionEvent, 4)
	var logs syncBuffer
	d, addr := testDaemon(t, backend, pkiDir, daemon.Hooks{
		OnRegistered: func(s daemon.SessionInfo) { registered <- s },
		OnCompletion: func(e daemon.CompletionEvent) { completed <- e },
	}, &logs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--dev-pki", pkiDir, "--dev-agent", "builder", "--endpoint", backend + "://" + addr,
			"--server-name", "localhost", "--max-parallel", "2", "--label", "demo", "--log-format", "json", "--log-level", "debug"}, io.Discard, &logs, nil)
	}()
	var s daemon.SessionInfo
	select {
	case s = <-registered:
	case code := <-done:
		t.Fatalf("agent exited %d: %s", code, logs.String())
	case <-time.After(10 * time.Second):
		t.Fatalf("no registration; logs:\n%s", logs.String())
	}
	if s.Runner != want.Runner || s.Backend != backend || s.AgentVersion != Version {
		t.Errorf("session %+v, want runner %v over %s", s, want.Runner, backend)
	}
	var spec wire.JobSpecId
	spec.Digest[0] = 7
	payload := wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: spec.Digest, Size: 1}
	var l authority.Lease
	deadline := time.Now().Add(5 * time.Second)
	for {
		octx, ocancel := context.WithTimeout(context.Background(), 5*time.Second)
		l, err = d.OfferLease(octx, s.Runner, daemon.LeaseOffer{Job: wire.NewJobId(), Spec: spec, Payload: payload})
		ocancel()
		if err != daemon.ErrNotConnected || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // registration hook fires before the session is active
	}
	if err != nil {
		t.Fatalf("offer: %v; agent logs:\n%s", err, logs.String())
	}
	select {
	case e := <-completed:
		if e.Attempt != l.Attempt || e.Ack != agentwire.AckAccepted || e.Result.Kind != agentwire.ResultSucceeded && e.Result.Kind != agentwire.ResultFailed {
			t.Errorf("completion %+v for lease %+v", e, l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no completion")
	}
	cancel()
	select {
	case code := <-done:
		if code != cli.ExitOK {
			t.Fatalf("exit %d; logs:\n%s", code, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("agent did not stop")
	}
	if out := logs.String(); !strings.Contains(out, `"msg":"agent starting"`) || !strings.Contains(out, `"msg":"agent stopped"`) {
		t.Errorf("logs:\n%s", out)
	}
}

// TestVersionMismatchIsFatal: a daemon that shares no protocol version makes
// the agent exit 1 with the daemon's message naming both ranges.
func TestVersionMismatchIsFatal(t *testing.T) {
	pkiDir := filepath.Join(t.TempDir(), "pki")
	var stls config.ServerTLS
	if _, err := daemonsetup.DevDaemon(pkiDir, &stls); err != nil {
		t.Fatal(err)
	}
	tc, _ := serversetup.ServerTLS(stls)
	au, err := authority.OpenSQLite(context.Background(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer au.Close()
	d, err := daemon.New(daemon.Config{Authority: au, Protocol: wire.ProtocolRange{Min: wire.V(9, 0), Max: wire.V(9, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := quic.Listen("127.0.0.1:0", tc, quic.Config{})
	if err != nil {
		t.Fatal(err)
	}
	go d.Serve(context.Background(), ln)
	defer func() { d.Shutdown(context.Background()); ln.Close() }()
	var o, e bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	code := run(ctx, []string{"--dev-pki", pkiDir, "--endpoint", "quic://" + ln.Addr().String(), "--server-name", "localhost"}, &o, &e, nil)
	if ctx.Err() != nil {
		t.Fatal("agent kept retrying after a version mismatch")
	}
	if code != cli.ExitFail || !strings.Contains(e.String(), "9.0") || !strings.Contains(e.String(), wire.Supported.Min.String()) {
		t.Errorf("exit %d, stderr:\n%s", code, e.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
