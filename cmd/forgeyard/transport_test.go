package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/adminapi"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/doctor"
	"forgeyard.dev/transport/internal/setup/agentsetup"
	"forgeyard.dev/transport/internal/testkit/binaries"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
)

// buildDaemon builds cmd/forgeyard-daemon once per test binary.
func buildDaemon(t *testing.T) string {
	t.Helper()
	return binaries.Build(t, "forgeyard-daemon")[0]
}

// testDaemon is a forgeyard-daemon process on loopback.
type testDaemon struct {
	quicAddr, admin, socket, token, tokenFile, pki string
	logs                                           *lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) add(s string) { l.mu.Lock(); l.b.WriteString(s + "\n"); l.mu.Unlock() }
func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startDaemon runs the daemon binary with a dev PKI, SQLite, QUIC on a free
// port, the admin endpoint on TCP (with a token) and a unix socket, and
// waits until both are serving.
func startDaemon(t *testing.T) *testDaemon {
	t.Helper()
	bin := buildDaemon(t)
	dir := t.TempDir()
	td := &testDaemon{pki: filepath.Join(dir, "pki"), socket: filepath.Join(dir, "admin.sock"), token: "s3cret-admin-token",
		tokenFile: filepath.Join(dir, "admin.token"), logs: &lockedBuffer{}}
	if err := os.WriteFile(td.tokenFile, []byte(td.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--id", "daemon-test", "--dev-pki", td.pki, "--sqlite", filepath.Join(dir, "a.db"), "--listen", "127.0.0.1:0",
		"--admin-listen", "127.0.0.1:0", "--admin-token-file", td.tokenFile, "--admin-socket", td.socket,
		"--log-format", "json", "--shutdown-timeout", "1s")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	found := make(chan struct{}, 3)
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			td.logs.add(line)
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) != nil {
				continue
			}
			switch rec["msg"] {
			case "listening":
				if rec["backend"] == "quic" {
					td.quicAddr, _ = rec["addr"].(string)
					found <- struct{}{}
				}
			case "admin endpoint listening":
				td.admin, _ = rec["addr"].(string)
				found <- struct{}{}
			case "admin socket listening":
				found <- struct{}{}
			}
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	for n := 0; n < 3; n++ {
		select {
		case <-found:
		case <-exited:
			t.Fatalf("daemon exited:\n%s", td.logs.String())
		case <-time.After(30 * time.Second):
			t.Fatalf("daemon not ready:\n%s", td.logs.String())
		}
	}
	return td
}

// connectAgent registers an in-process agent with the daemon and returns
// its runner; it leaves at test cleanup.
func connectAgent(t *testing.T, td *testDaemon) wire.RunnerId {
	t.Helper()
	var cp config.ControlPlane
	if _, err := agentsetup.DevAgent(td.pki, "a1", &cp); err != nil {
		t.Fatal(err)
	}
	cred, err := agentsetup.LoadCredential(cp)
	if err != nil {
		t.Fatal(err)
	}
	e, _ := config.ParseEndpoint("quic://" + td.quicAddr)
	dialer, daddr, _ := agentsetup.Dialer(e, cred.Client, quic.Config{}, yamux.Config{})
	connected := make(chan struct{}, 1)
	a, err := agent.New(agent.Config{Runner: cred.Runner, Signer: cred.Signer, CertChain: cred.CertChain,
		Endpoints: []agent.Endpoint{{Address: daddr, Dialer: dialer, Backend: "quic"}},
		Executor:  agent.NewSyntheticExecutor(1, agent.SyntheticOptions{}), MaxParallel: 1, Version: "cli-test/1",
		Hooks: agent.Hooks{OnConnected: func(agent.Status) {
			select {
			case connected <- struct{}{}:
			default:
			}
		}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; a.Close() })
	select {
	case <-connected:
	case err := <-done:
		t.Fatalf("agent ended: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatalf("agent did not register:\n%s", td.logs.String())
	}
	return cred.Runner
}

// TestTransportCommands runs every `forgeyard transport` command in-process
// against a real daemon process with one agent connected, over TCP with
// the token and over the unix socket, in table and JSON form.
func TestTransportCommands(t *testing.T) {
	td := startDaemon(t)
	runner := connectAgent(t, td)
	tcp := []string{"--admin", "http://" + td.admin, "--token-file", td.tokenFile}
	sock := []string{"--admin", "unix://" + td.socket}

	for _, via := range [][]string{tcp, sock} {
		// status, table
		code, out, errOut := runCLI(t, append([]string{"transport", "status"}, via...)...)
		if code != cli.ExitOK {
			t.Fatalf("status %v: exit %d: %s", via, code, errOut)
		}
		for _, want := range []string{"DAEMON              daemon-test", "STATUS              ok", "CONNECTIONS         1 (quic=1)",
			"SESSIONS            1", "HANDSHAKE FAILURES  0", "days to expiry", "AUTHORITY           sqlite, reachable",
			"DRAINING            no", "LISTENER ", "BACKEND", "STATE", td.quicAddr + "  quic     up"} {
			if !strings.Contains(out, want) {
				t.Errorf("status %v lacks %q:\n%s", via, want, out)
			}
		}
		// status, JSON
		code, out, _ = runCLI(t, append([]string{"transport", "status", "--json"}, via...)...)
		var st adminapi.Status
		if err := json.Unmarshal([]byte(out), &st); err != nil || code != cli.ExitOK {
			t.Fatalf("status --json: exit %d, %v\n%s", code, err, out)
		}
		if st.Status != telemetry.StatusOK || st.Daemon != "daemon-test" || st.Connections != 1 || st.ConnectionsByBackend["quic"] != 1 ||
			!st.Authority.Reachable || st.Authority.Backend != "sqlite" || len(st.Listeners) != 1 || st.Listeners[0].State != adminapi.ListenerUp ||
			st.Certificate == nil || !st.Certificate.Valid || st.Certificate.DaysToExpiry < 80 || st.Draining {
			t.Errorf("status JSON %+v", st)
		}
	}

	// sessions
	code, out, errOut := runCLI(t, append([]string{"transport", "sessions"}, tcp...)...)
	if code != cli.ExitOK {
		t.Fatalf("sessions: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"RUNNER", "BACKEND", "PROTOCOL", "REMOTE", "LAST HEARTBEAT", runner.String(), " quic ", " " + wire.Current.String() + " ", "cli-test/1", "1 transports"} {
		if !strings.Contains(out, want) {
			t.Errorf("sessions lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = runCLI(t, append([]string{"transport", "sessions", "--json"}, sock...)...)
	var ss []adminapi.Session
	if err := json.Unmarshal([]byte(out), &ss); err != nil || code != cli.ExitOK {
		t.Fatalf("sessions --json: %d %v\n%s", code, err, out)
	}
	if len(ss) != 1 || ss[0].Runner != runner.String() || ss[0].Backend != "quic" || ss[0].Protocol != wire.Current.String() || ss[0].AgentVersion != "cli-test/1" {
		t.Errorf("sessions JSON %+v", ss)
	}

	// protocols
	code, out, errOut = runCLI(t, append([]string{"transport", "protocols"}, tcp...)...)
	if code != cli.ExitOK {
		t.Fatalf("protocols: exit %d: %s", code, errOut)
	}
	sup := wire.Supported.Min.String() + "–" + wire.Supported.Max.String()
	for _, want := range []string{"SUPPORTED     " + sup, "CONFIGURED    " + sup, "MIN PROTOCOL  " + wire.Supported.Min.String(), "FEATURES", "PROTOCOL  AGENTS", fmt.Sprintf("%-9s 1", wire.Current)} {
		if !strings.Contains(out, want) {
			t.Errorf("protocols lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = runCLI(t, append([]string{"transport", "protocols", "--json"}, tcp...)...)
	var p adminapi.Protocols
	if err := json.Unmarshal([]byte(out), &p); err != nil || code != cli.ExitOK {
		t.Fatalf("protocols --json: %d %v\n%s", code, err, out)
	}
	if len(p.Agents) != 1 || p.Agents[0] != (adminapi.VersionCount{Protocol: wire.Current.String(), Agents: 1}) || p.Supported.Max != wire.Supported.Max.String() {
		t.Errorf("protocols JSON %+v", p)
	}

	// doctor: everything up; QUIC only is a warning, not a failure.
	code, out, errOut = runCLI(t, append([]string{"transport", "doctor"}, tcp...)...)
	if code != cli.ExitOK {
		t.Fatalf("doctor: exit %d: %s\n%s", code, errOut, out)
	}
	for _, want := range []string{"RESULT  CHECK", "OK      listener", "quic " + td.quicAddr, "OK      certificate", "OK      authority",
		"WARN    fallback", "fix: also set listen.yamux", "OK      agents", "1 connections (quic=1), 1 sessions", "WARN: "} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = runCLI(t, append([]string{"transport", "doctor", "--json"}, sock...)...)
	var rep doctor.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != cli.ExitOK {
		t.Fatalf("doctor --json: %d %v\n%s", code, err, out)
	}
	if rep.Result != doctor.Warn || len(rep.Findings) < 6 {
		t.Errorf("doctor JSON %+v", rep)
	}
}

// TestTransportErrors: every way of reaching the admin endpoint wrongly
// gets an actionable message and exit 1 (2 for usage errors).
func TestTransportErrors(t *testing.T) {
	td := startDaemon(t)
	dir := t.TempDir()
	wrong := filepath.Join(dir, "wrong.token")
	os.WriteFile(wrong, []byte("not-the-token\n"), 0o600)
	empty := filepath.Join(dir, "empty.token")
	os.WriteFile(empty, nil, 0o600)
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a port nobody serves once closed
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	t.Setenv(adminapi.TokenEnv, "")

	for _, c := range []struct {
		args []string
		env  string
		code int
		want string
	}{
		{[]string{"status", "--admin", td.admin, "--token-file", wrong}, "", cli.ExitFail, "401: the token in " + wrong + " does not match the daemon's admin.token_file"},
		{[]string{"sessions", "--admin", td.admin}, "", cli.ExitFail, "401: admin endpoint " + td.admin + " requires a token: pass --token-file FILE"},
		{[]string{"protocols", "--admin", td.admin}, "bad-env-token", cli.ExitFail, "401: the token in $FORGEYARD_ADMIN_TOKEN does not match"},
		{[]string{"status", "--admin", "http://" + dead}, "", cli.ExitFail, "admin endpoint " + dead + " refused the connection: is forgeyard-daemon running with --admin-listen " + dead + "?"},
		{[]string{"status", "--admin", "unix://" + filepath.Join(dir, "nope.sock")}, "", cli.ExitFail, "does not exist: is forgeyard-daemon running with --admin-socket"},
		{[]string{"status", "--admin", td.admin, "--token-file", empty}, "", cli.ExitUsage, "is empty"},
		{[]string{"status", "--admin", "ftp://x"}, "", cli.ExitUsage, "want http://HOST:PORT or unix:///PATH"},
		{[]string{"status", "extra"}, "", cli.ExitUsage, "unexpected argument"},
		{[]string{"frobnicate"}, "", cli.ExitUsage, "unknown command"},
	} {
		t.Setenv(adminapi.TokenEnv, c.env)
		code, _, errOut := runCLI(t, append([]string{"transport"}, c.args...)...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d with %q", c.args, code, errOut, c.code, c.want)
		}
	}
	t.Setenv(adminapi.TokenEnv, "")

	// /healthz and /metrics stay open without a token? /metrics needs it
	// (no --admin-public-metrics) and /healthz never does.
	c, err := adminapi.NewClient(td.admin, "", "", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var h telemetry.DaemonHealth
	if err := c.Get(context.Background(), adminapi.PathHealth, &h); err != nil || h.Status != telemetry.StatusOK {
		t.Errorf("/healthz without token: %v %+v", err, h)
	}

	// doctor against a dead endpoint: FAIL with the reason, exit 1.
	code, out, _ := runCLI(t, "transport", "doctor", "--admin", dead)
	if code != cli.ExitFail || !strings.Contains(out, "FAIL    admin") || !strings.Contains(out, "refused the connection") || !strings.Contains(out, "FAIL: 1 checks, 1 failed") {
		t.Errorf("doctor on a dead endpoint: exit %d\n%s", code, out)
	}

	// the socket is owner-only
	fi, err := os.Stat(td.socket)
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("admin socket mode: %v %v", fi.Mode(), err)
	}
}

// TestDaemonDoctorFindings: each bad fact of /status becomes its finding
// with a fix (served by a fake admin endpoint).
func TestDaemonDoctorFindings(t *testing.T) {
	now := time.Now()
	st := adminapi.Status{Status: telemetry.StatusDown, Daemon: "d9", Draining: true,
		Listeners:   []adminapi.Listener{{Backend: "quic", Address: "0.0.0.0:7443", State: adminapi.ListenerDown, Error: "bind: address already in use"}},
		Certificate: &telemetry.CertHealth{Subject: "CN=d9", NotBefore: now.Add(-80 * 24 * time.Hour), NotAfter: now.Add(5 * 24 * time.Hour), Valid: true, DaysToExpiry: 5},
		Authority:   adminapi.Authority{Backend: "postgres", Error: "dial tcp 10.0.0.5:5432: connection refused"}, HandshakeFailures: 3, RegistrationFailures: 2}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(&st)
	}))
	defer srv.Close()
	c, err := adminapi.NewClient(srv.URL, "", "", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	get := func() map[string]doctor.Finding {
		r := daemonDoctor(context.Background(), c, now)
		m := map[string]doctor.Finding{}
		for _, f := range r.Findings {
			m[f.Check] = f
		}
		return m
	}
	m := get()
	for check, want := range map[string]struct {
		res         doctor.Result
		detail, fix string
	}{
		"listener":      {doctor.Fail, "bind: address already in use", "check the port is free"},
		"certificate":   {doctor.Warn, "(5 days)", "rotate tls.certificate"},
		"authority":     {doctor.Fail, "connection refused", "PostgreSQL"},
		"draining":      {doctor.Warn, "shutting down", ""},
		"agents":        {doctor.Warn, "no agent is connected", "forgeyard-agent doctor"},
		"handshakes":    {doctor.Warn, "3 TLS handshakes failed over a certificate", "auth.failure"},
		"registrations": {doctor.Warn, "2 hellos or registrations refused", "auth.failure"},
	} {
		f := m[check]
		if f.Result != want.res || !strings.Contains(f.Detail, want.detail) || !strings.Contains(f.Fix, want.fix) {
			t.Errorf("%s = %+v, want %s with %q / fix %q", check, f, want.res, want.detail, want.fix)
		}
	}
	st.Certificate = &telemetry.CertHealth{Subject: "CN=d9", NotAfter: now.Add(-time.Hour), Valid: false, DaysToExpiry: -1}
	st.Listeners = nil
	m = get()
	if f := m["certificate"]; f.Result != doctor.Fail || !strings.Contains(f.Detail, "expired at") {
		t.Errorf("expired certificate: %+v", f)
	}
	if f := m["listeners"]; f.Result != doctor.Fail || !strings.Contains(f.Fix, "listen.quic") {
		t.Errorf("no listener: %+v", f)
	}
}
