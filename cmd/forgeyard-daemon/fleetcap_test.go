package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/agentsetup"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
)

// TestConnectionCapRefusesBeforeHandshake runs the daemon main with
// [admission] max_connections = 1: with one agent registered, a second
// agent's QUIC dial is refused before its handshake (CloseOverloaded at
// the dialer, no TLS), and /healthz reports the refusal from its counters
// (refusals.handshake and .early) along with the connection counts.
func TestConnectionCapRefusesBeforeHandshake(t *testing.T) {
	dir := t.TempDir()
	pkiDir := filepath.Join(dir, "pki")
	conf := filepath.Join(dir, "daemon.toml")
	if err := os.WriteFile(conf, []byte("[admission]\nmax_connections = 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	readyc, adminc := make(chan string, 1), make(chan string, 1)
	th := &testHooks{
		ready: func(d *daemon.Daemon, ls []serversetup.Listener) { readyc <- ls[0].Addr().String() },
		admin: func(addr string) { adminc <- addr },
	}
	var logs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--config", conf, "--dev-pki", pkiDir, "--listen", "127.0.0.1:0", "--sqlite", filepath.Join(dir, "a.db"),
			"--admin-listen", "127.0.0.1:0", "--log-format", "json", "--shutdown-timeout", "2s"}, io.Discard, &logs, th)
	}()
	var addr, admin string
	for addr == "" || admin == "" {
		select {
		case admin = <-adminc:
		case addr = <-readyc:
		case code := <-done:
			t.Fatalf("daemon exited %d before ready: %s", code, logs.String())
		case <-time.After(10 * time.Second):
			t.Fatal("daemon not ready")
		}
	}
	dialerFor := func(name string) (semantics.BackendDialer, string, config.ControlPlane) {
		var cp config.ControlPlane
		if _, err := agentsetup.DevAgent(pkiDir, name, &cp); err != nil {
			t.Fatal(err)
		}
		cred, err := agentsetup.LoadCredential(cp)
		if err != nil {
			t.Fatal(err)
		}
		e, _ := config.ParseEndpoint("quic://" + addr)
		d, daddr, err := agentsetup.Dialer(e, cred.Client, quic.Config{}, yamux.Config{})
		if err != nil {
			t.Fatal(err)
		}
		return d, daddr, cp
	}
	d1, daddr, cp := dialerFor("a1")
	cred, _ := agentsetup.LoadCredential(cp)
	connected := make(chan agent.Status, 1)
	a, err := agent.New(agent.Config{Runner: cred.Runner, Signer: cred.Signer, CertChain: cred.CertChain,
		Endpoints: []agent.Endpoint{{Address: daddr, Dialer: d1, Backend: "quic"}},
		Executor:  agent.NewSyntheticExecutor(1, agent.SyntheticOptions{}), Fallback: agent.Fallback{ProbeInterval: -1},
		Hooks: agent.Hooks{OnConnected: func(s agent.Status) { connected <- s }}})
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(context.Background())
	adone := make(chan error, 1)
	go func() { adone <- a.Run(actx) }()
	defer func() { acancel(); <-adone; a.Close() }()
	select {
	case <-connected:
	case <-time.After(15 * time.Second):
		t.Fatalf("first agent not connected: %s", logs.String())
	}

	d2, daddr2, _ := dialerFor("a2")
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()
	_, err = d2.Dial(dctx, daddr2)
	var ce *semantics.ConnError
	if !errors.As(err, &ce) || ce.Code != wire.CloseOverloaded || !ce.Remote {
		t.Fatalf("second dial over max_connections = 1: %v, want a remote ConnError Overloaded", err)
	}

	code, _, body := httpGet(t, "http://"+admin+"/healthz")
	if code != 200 {
		t.Fatalf("/healthz %d %s", code, body)
	}
	var h telemetry.DaemonHealth
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		t.Fatal(err)
	}
	if h.Connections != 1 || h.Sessions != 1 || h.ConnectionsByBackend["quic"] != 1 {
		t.Fatalf("/healthz counts %+v, want 1 quic connection and session", h)
	}
	if h.Refusals.Handshake < 1 || h.Refusals.Early < 1 {
		t.Fatalf("/healthz refusals %+v, want the refused dial counted (handshake and early)", h.Refusals)
	}
	code, _, text := httpGet(t, "http://"+admin+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics %d", code)
	}
	if v := metricValue(t, text, `forgeyard_daemon_admission_refused_total{stage="early"}`); v < 1 {
		t.Errorf(`forgeyard_daemon_admission_refused_total{stage="early"} = %v, want the refused dial counted`, v)
	}
}
