package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/buildinfo"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/agentsetup"
	"forgeyard.dev/transport/internal/setup/daemonsetup"
	"forgeyard.dev/transport/internal/setup/relaysetup"
	"forgeyard.dev/transport/relay"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
)

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

func TestHelp(t *testing.T) {
	var out bytes.Buffer
	if code := run(context.Background(), []string{"--help"}, &out, io.Discard, nil); code != cli.ExitOK {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"--config", "-listen-yamux", "-listen-webtransport", "-cert", "-client-ca", "-upstream",
		"-upstream-ca", "-upstream-cert", "-dial-timeout", "-max-connections", "-max-streams-per-connection",
		"-dev-pki", "DEVELOPMENT ONLY", "-admin-listen", "-metrics-listen", "SIGINT"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help lacks %q", want)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte("[upstream]\nendpoints = [\"yamux://d:7444\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pki := filepath.Join(dir, "pki")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "flag provided but not defined"},
		{[]string{"extra"}, "unexpected argument"},
		{[]string{"--upstream", "d:7443"}, "tls.certificate: required"},
		{[]string{"--dev-pki", pki}, "upstream.endpoints: required"},
		{[]string{"--config", bad, "--dev-pki", pki}, "bad.toml: upstream.endpoints[0]"},
		{[]string{"--dev-pki", pki, "--upstream", "d:7443", "--listen-yamux", "nope"}, "listen.yamux"},
		{[]string{"--dev-pki", pki, "--upstream", "d:7443", "--admin-listen", "10.1.2.3:9465"}, "admin.listen"},
		{[]string{"--config", filepath.Join(dir, "missing.toml")}, "no such file"},
	} {
		var errOut bytes.Buffer
		code := run(context.Background(), c.args, io.Discard, &errOut, nil)
		if code != cli.ExitUsage || !strings.Contains(errOut.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q, want exit 2 with %q", c.args, code, errOut.String(), c.want)
		}
	}
}

// TestDefaultsMatchPackage keeps internal/config's relay defaults equal to
// package relay's.
func TestDefaultsMatchPackage(t *testing.T) {
	if config.DefaultRelayDialTimeout != relay.DefaultDialTimeout || config.DefaultRelayMaxConnections != relay.DefaultMaxConns ||
		config.DefaultRelayMaxStreamsPerConn != relay.DefaultMaxStreamsPerConn || config.DefaultRelayCopyBuffer != relay.DefaultCopyBuffer ||
		config.DefaultRelayStreamWindow != relay.DefaultAgentStreamWindow {
		t.Fatal("config.DefaultRelay* and relay.Default* differ")
	}
}

// TestRunRelaysAgent runs the command in-process with --dev-pki between a
// daemon (semantics/daemon over QUIC, mTLS with the same dev PKI) and an
// agent over TLS+yamux: the agent registers and completes a lease, /metrics
// and /healthz answer, and cancelling the context (SIGTERM) exits 0 after
// closing the agent with CloseShutdown.
func TestRunRelaysAgent(t *testing.T) {
	ctx, cancelTest := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancelTest()
	dir := t.TempDir()
	pkiDir := filepath.Join(dir, "pki")
	pki, err := trust.GenerateDevPKI(pkiDir, trust.DevPKIOptions{Agents: []string{"a1"}})
	if err != nil {
		t.Fatal(err)
	}

	// The daemon.
	serverTLS, err := trust.ServerConfig(trust.ServerFiles{CertFile: pki.Server.CertFile, KeyFile: pki.Server.KeyFile,
		ClientCAFile: pki.CA.CertFile, RequireClientCert: true})
	if err != nil {
		t.Fatal(err)
	}
	runnerCAs, err := daemonsetup.RunnerCAs(pki.CA.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := authority.OpenSQLite(ctx, ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer auth.Close()
	registered := make(chan daemon.SessionInfo, 4)
	completions := make(chan daemon.CompletionEvent, 4)
	d, err := daemon.New(daemon.Config{Authority: auth, RunnerCAs: runnerCAs, Hooks: daemon.Hooks{
		OnRegistered: func(s daemon.SessionInfo) { registered <- s },
		OnCompletion: func(e daemon.CompletionEvent) { completions <- e },
	}})
	if err != nil {
		t.Fatal(err)
	}
	dl, err := quic.Listen("127.0.0.1:0", serverTLS, quic.Config{})
	if err != nil {
		t.Fatal(err)
	}
	dctx, dcancel := context.WithCancel(context.Background())
	ddone := make(chan struct{})
	go func() { defer close(ddone); _ = d.Serve(dctx, dl) }()
	defer func() {
		sctx, c := context.WithTimeout(context.Background(), 3*time.Second)
		defer c()
		_ = d.Shutdown(sctx)
		dcancel()
		_ = dl.Close()
		<-ddone
	}()

	// The relay command.
	type readyInfo struct {
		addrs map[string]net.Addr
		admin string
	}
	readyc := make(chan readyInfo, 1)
	th := &testHooks{ready: func(_ *relay.Relay, ls map[string]net.Addr, admin string) { readyc <- readyInfo{ls, admin} }}
	rctx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	var logs syncBuffer
	exited := make(chan int, 1)
	go func() {
		exited <- run(rctx, []string{"--dev-pki", pkiDir, "--listen-yamux", "127.0.0.1:0",
			"--upstream", "quic://" + dl.Addr().String(), "--dial-timeout", "2s", "--metrics-listen", "127.0.0.1:0",
			"--log-format", "json", "--shutdown-timeout", "3s"}, io.Discard, &logs, th)
	}()
	var ready readyInfo
	select {
	case ready = <-readyc:
	case code := <-exited:
		t.Fatalf("relay exited %d before ready: %s", code, logs.String())
	case <-ctx.Done():
		t.Fatal("relay not ready")
	}
	if _, err := os.Stat(filepath.Join(pkiDir, relaysetup.DevRelayCertFile)); err != nil {
		t.Fatalf("dev relay certificate: %v", err)
	}

	// The agent, through the relay over TLS+yamux.
	var cp config.ControlPlane
	if _, err := agentsetup.DevAgent(pkiDir, "a1", &cp); err != nil {
		t.Fatal(err)
	}
	cred, err := agentsetup.LoadCredential(cp)
	if err != nil {
		t.Fatal(err)
	}
	e, err := config.ParseEndpoint("yamux://" + ready.addrs[config.BackendYamux].String())
	if err != nil {
		t.Fatal(err)
	}
	tc := cred.Client.Clone()
	tc.ServerName = "localhost"
	dialer, addr, _ := agentsetup.Dialer(e, tc, quic.Config{}, yamux.Config{})
	disconnects := make(chan error, 4)
	connected := make(chan struct{}, 4)
	a, err := agent.New(agent.Config{Runner: cred.Runner, Signer: cred.Signer, CertChain: cred.CertChain,
		Endpoints: []agent.Endpoint{{Address: addr, Dialer: dialer, Backend: "yamux"}},
		Executor:  agent.NewSyntheticExecutor(1, agent.SyntheticOptions{}), SpoolDir: t.TempDir(),
		Hooks: agent.Hooks{OnConnected: func(agent.Status) { connected <- struct{}{} }, OnDisconnected: func(err error) {
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
	defer func() { acancel(); <-adone; _ = a.Close() }()
	select {
	case s := <-registered:
		if s.Runner != cred.Runner || s.Backend != "quic" {
			t.Fatalf("registered %+v", s)
		}
	case <-ctx.Done():
		t.Fatalf("no registration; relay logs:\n%s", logs.String())
	}
	select {
	case <-connected:
	case <-ctx.Done():
		t.Fatal("agent not connected")
	}
	lease, err := d.OfferLease(ctx, cred.Runner, daemon.LeaseOffer{Job: wire.NewJobId(), Spec: wire.JobSpecId{Digest: wire.Digest{1}},
		Payload: wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: wire.Digest{2}, Size: 64}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-completions:
		if ev.Attempt != lease.Attempt {
			t.Fatalf("completion %+v", ev)
		}
	case <-ctx.Done():
		t.Fatal("no completion")
	}

	// The admin endpoint.
	body := httpGet(t, "http://"+ready.admin+"/metrics", http.StatusOK)
	for _, want := range []string{`forgeyard_relay_connections_total{backend="yamux"} 1`, `forgeyard_relay_connections_active{backend="yamux"} 1`,
		`forgeyard_relay_bytes_total{backend="yamux",direction="to_daemon"}`, `forgeyard_relay_streams_total{backend="yamux",opener="agent"}`,
		"go_goroutines"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if bi := buildinfo.Get(); !strings.Contains(body, `forgeyard_build_info{commit="`+bi.ShortCommit()+`",goversion="`+bi.GoVersion+`",protocol_max="`+bi.Protocol.Max.String()+`",protocol_min="`+bi.Protocol.Min.String()+`",version="`+bi.Version+`"} 1`) {
		t.Errorf("/metrics lacks forgeyard_build_info of this build")
	}
	var h struct {
		Status    string
		Listeners map[string]string
		Active    int64
	}
	if err := json.Unmarshal([]byte(httpGet(t, "http://"+ready.admin+"/healthz", http.StatusOK)), &h); err != nil {
		t.Fatal(err)
	}
	if h.Status != "ok" || h.Active != 1 || h.Listeners["yamux"] == "" {
		t.Fatalf("/healthz %+v", h)
	}

	// SIGTERM: exit 0, the agent sees the relay's CloseShutdown.
	stopRelay()
	select {
	case code := <-exited:
		if code != cli.ExitOK {
			t.Fatalf("exit %d; logs:\n%s", code, logs.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("relay did not shut down")
	}
	select {
	case err := <-disconnects:
		var ce *semantics.ConnError
		if !errors.As(err, &ce) || ce.Code != wire.CloseShutdown || ce.Reason != "relay shutting down" {
			t.Fatalf("agent disconnected with %v, want the relay's CloseShutdown", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("agent not disconnected")
	}
	if !strings.Contains(logs.String(), `"msg":"relay stopped"`) {
		t.Errorf("no stop record in logs:\n%s", logs.String())
	}
}

func httpGet(t *testing.T, url string, want int) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}
