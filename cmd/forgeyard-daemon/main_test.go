package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/agentsetup"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/internal/testkit/binaries"
	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

func runDaemon(t *testing.T, ctx context.Context, th *testHooks, args ...string) (int, string, string) {
	t.Helper()
	var o, e bytes.Buffer
	code := run(ctx, args, &o, &e, th)
	return code, o.String(), e.String()
}

func TestHelp(t *testing.T) {
	code, out, _ := runDaemon(t, context.Background(), nil, "--help")
	if code != cli.ExitOK {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"--config", "-listen", "-listen-yamux", "-cert", "-key", "-client-ca", "-sqlite", "-postgres-dsn-file", "-log-level", "-demo-leases", "DEVELOPMENT ONLY", "SIGINT", "-admin-listen", "-admin-allow-remote"} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q", want)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("[tls]\ncertificate = \"s.pem\"\nprivate_key = \"-----BEGIN PRIVATE KEY-----\"\nclient_ca = \"ca.pem\"\n[authority]\nsqlite = \"a.db\"\n"), 0o600)
	badLimit := filepath.Join(dir, "limit.toml")
	os.WriteFile(badLimit, []byte("[admission]\nmax_handshakes = -5\n"), 0o600)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "flag provided but not defined"},
		{[]string{"extra"}, "unexpected argument"},
		{[]string{"--sqlite", "a.db"}, "tls.certificate: required"},
		{[]string{"--config", bad}, "bad.toml: tls.private_key: holds inline PEM"},
		{[]string{"--config", filepath.Join(dir, "missing.toml")}, "no such file"},
		{[]string{"--dev-pki", filepath.Join(dir, "pki"), "--listen", "nope"}, "listen.quic"},
		{[]string{"--demo-leases", "-1"}, "--demo-leases"},
		{[]string{"--config", badLimit, "--dev-pki", filepath.Join(dir, "pki"), "--sqlite", filepath.Join(dir, "a.db")},
			"limit.toml: admission.max_handshakes: must not be negative (0: the default); got -5"},
		{[]string{"--dev-pki", filepath.Join(dir, "pki"), "--sqlite", filepath.Join(dir, "a.db"), "--matrix-driver"}, "--matrix-driver needs a loopback --admin-listen"},
		{[]string{"--dev-pki", filepath.Join(dir, "pki"), "--sqlite", filepath.Join(dir, "a.db"), "--protocol", "1.x"}, "--protocol: protocol version"},
		{[]string{"--dev-pki", filepath.Join(dir, "pki"), "--sqlite", filepath.Join(dir, "a.db"), "--protocol", "2.0-2.0"}, "does not overlap"},
	} {
		code, _, errOut := runDaemon(t, context.Background(), nil, c.args...)
		if code != cli.ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 containing %q", c.args, code, errOut, c.want)
		}
	}
}

// TestDemoLeasesOverQUIC runs the daemon main in-process with a dev PKI on
// QUIC loopback; an agent (semantics/agent with the synthetic executor)
// registers, receives the --demo-leases offers, completes them, and SIGINT
// (ctx cancel) shuts the daemon down cleanly.
func TestDemoLeasesOverQUIC(t *testing.T) {
	data := t.TempDir()
	demoLeases(t, "--sqlite", filepath.Join(t.TempDir(), "a.db"),
		"--log-dir", filepath.Join(data, "logs"), "--cas-dir", filepath.Join(data, "cas"))
	// The data plane is on: the attempts' logs and outputs landed in the
	// configured directories.
	var logsN, objects int
	_ = filepath.WalkDir(data, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			switch {
			case strings.HasSuffix(p, ".log"):
				logsN++
			case strings.Contains(p, string(filepath.Separator)+"objects"+string(filepath.Separator)):
				objects++
			}
		}
		return nil
	})
	t.Logf("data dirs: %d attempt logs, %d CAS objects", logsN, objects)
	if logsN != 2 || objects != 2 {
		t.Errorf("data dirs hold %d attempt logs and %d CAS objects, want 2 and 2", logsN, objects)
	}
}

// TestPostgresAuthority: the same with --postgres-dsn-file (the HA setup).
func TestPostgresAuthority(t *testing.T) {
	dsnFile := filepath.Join(t.TempDir(), "pg.dsn")
	if err := os.WriteFile(dsnFile, []byte(pgtest.Shared(t).NewDatabase(t)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	demoLeases(t, "--postgres-dsn-file", dsnFile)
}

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	binaries.Cleanup()
	os.Exit(code)
}

func demoLeases(t *testing.T, authorityFlags ...string) {
	demoLeasesN(t, 2, 2, authorityFlags...)
}

// TestDemoLeasesWithinCapacity (issue 27 item 1): --demo-leases 3 to an
// agent that runs one at a time offers the next only when one completed:
// all 3 complete and none is rejected with AtCapacity.
//
// With no data.cas_dir configured the daemon keeps the uploaded outputs
// in "cas" beside its --dev-pki directory, and says where at start.
func TestDemoLeasesWithinCapacity(t *testing.T) {
	logs := demoLeasesN(t, 3, 1, "--sqlite", filepath.Join(t.TempDir(), "a.db"))
	for _, bad := range []string{"AtCapacity", "lease rejected by agent", "demo lease not accepted"} {
		if strings.Contains(logs, bad) {
			t.Errorf("daemon log mentions %q:\n%s", bad, logs)
		}
	}
	dir := ""
	for _, line := range strings.Split(logs, "\n") {
		var rec struct{ Msg, Dir string }
		if json.Unmarshal([]byte(line), &rec) == nil && strings.HasPrefix(rec.Msg, "content store: a local directory") {
			dir = rec.Dir
		}
	}
	if filepath.Base(dir) != "cas" || filepath.Base(filepath.Dir(dir)) != "pki" {
		t.Fatalf("default content store %q, want cas beside the --dev-pki directory; log:\n%s", dir, logs)
	}
	objects := 0
	_ = filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() && strings.Contains(p, string(filepath.Separator)+"objects"+string(filepath.Separator)) {
			objects++
		}
		return nil
	})
	if objects != 3 {
		t.Errorf("default content store holds %d objects, want the 3 attempts' outputs", objects)
	}
}

// demoLeasesN runs the daemon with --demo-leases n and one agent running
// maxParallel attempts at once until the n leases completed; it returns
// the daemon's log.
func demoLeasesN(t *testing.T, n, maxParallel int, authorityFlags ...string) string {
	dir := t.TempDir()
	pkiDir := filepath.Join(dir, "pki")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	readyc := make(chan string, 1)
	completions := make(chan daemon.CompletionEvent, 16)
	th := &testHooks{
		ready: func(d *daemon.Daemon, ls []serversetup.Listener) { readyc <- ls[0].Addr().String() },
		onCompletion: func(e daemon.CompletionEvent) {
			select {
			case completions <- e:
			default:
			}
		},
	}
	var logs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"--dev-pki", pkiDir, "--listen", "127.0.0.1:0",
			"--demo-leases", strconv.Itoa(n), "--log-format", "json", "--shutdown-timeout", "2s"}, authorityFlags...), io.Discard, &logs, th)
	}()
	var addr string
	select {
	case addr = <-readyc:
	case code := <-done:
		t.Fatalf("daemon exited %d before ready: %s", code, logs.String())
	case <-time.After(10 * time.Second):
		t.Fatal("daemon not ready")
	}

	disconnects := make(chan error, 4)
	var cp config.ControlPlane
	if _, err := agentsetup.DevAgent(pkiDir, "a1", &cp); err != nil {
		t.Fatal(err)
	}
	cred, err := agentsetup.LoadCredential(cp)
	if err != nil {
		t.Fatal(err)
	}
	e, _ := config.ParseEndpoint("quic://" + addr)
	dialer, daddr, _ := agentsetup.Dialer(e, cred.Client, quic.Config{}, yamux.Config{})
	a, err := agent.New(agent.Config{Runner: cred.Runner, Signer: cred.Signer, CertChain: cred.CertChain,
		Endpoints: []agent.Endpoint{{Address: daddr, Dialer: dialer, Backend: "quic"}},
		Executor:  agent.NewSyntheticExecutor(1, agent.SyntheticOptions{}), MaxParallel: maxParallel, Version: "test", SpoolDir: filepath.Join(dir, "spool"),
		Hooks: agent.Hooks{OnDisconnected: func(err error) {
			select {
			case disconnects <- err:
			default:
			}
		}}})
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(context.Background())
	adone := make(chan error, 1)
	go func() { adone <- a.Run(actx) }()
	defer func() { acancel(); <-adone; a.Close() }()

	seen := map[wire.JobAttemptId]bool{}
	for len(seen) < n {
		select {
		case ev := <-completions:
			if ev.Runner != cred.Runner || ev.Ack != agentwire.AckAccepted {
				t.Errorf("completion %+v", ev)
			}
			seen[ev.Attempt] = true
		case <-time.After(15 * time.Second):
			t.Fatalf("%d of %d demo leases completed; logs:\n%s", len(seen), n, logs.String())
		}
	}
	cancel() // SIGINT
	select {
	case code := <-done:
		if code != cli.ExitOK {
			t.Fatalf("exit %d; logs:\n%s", code, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("daemon did not shut down")
	}
	// The agent was told to go away (drain hint), not just dropped.
	select {
	case err := <-disconnects:
		if err == nil || !strings.Contains(err.Error(), "GoAway") {
			t.Errorf("agent disconnect: %v, want GoAway", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("agent never saw the shutdown")
	}
	out := logs.String()
	for _, want := range []string{`"msg":"agent registered"`, `"msg":"demo lease accepted"`, `"msg":"daemon stopped"`, `"leases_accepted":` + strconv.Itoa(n), cred.Runner.String()} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %s", want)
		}
	}
	return out
}

// syncBuffer is a bytes.Buffer safe for the logger and the test.
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

// TestConnLimitsFromConfig: the [limits] section reaches the engine's
// semantics.Limits (certificate_rate_per_min is per minute), zero keys
// keep the library defaults, and the result validates.
func TestConnLimitsFromConfig(t *testing.T) {
	l := connLimits(config.ConnLimits{MaxStreams: 64, HeartbeatRate: 5, HeartbeatBurst: 10,
		CertificateRatePerMin: 2, CertificateBurst: 3, MaxRateStrikes: 9})
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	d := l.WithDefaults()
	if d.MaxStreams != 64 || d.HeartbeatRate != (semantics.Rate{PerSecond: 5, Burst: 10}) || d.MaxRateStrikes != 9 {
		t.Errorf("limits %+v", d)
	}
	if d.IdentityRate != (semantics.Rate{PerSecond: 2.0 / 60, Burst: 3}) {
		t.Errorf("certificate rate %v, want 2/min burst 3", d.IdentityRate)
	}
	if d.ControlRate != semantics.DefaultControlRate || d.CasRate != semantics.DefaultCasRate {
		t.Errorf("unset rates %v %v, want the defaults", d.ControlRate, d.CasRate)
	}
	if def := connLimits(config.ConnLimits{}).WithDefaults(); def.IdentityRate != semantics.DefaultIdentityRate {
		t.Errorf("empty [limits]: certificate rate %v", def.IdentityRate)
	}
}
