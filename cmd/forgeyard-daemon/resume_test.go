package main

import (
	"context"
	"io"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/agentsetup"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// TestSessionResumptionAcrossRestart (issue 25 item 4): the daemon
// process issues tickets under its authority's keys, so an agent (its
// credential as forgeyard-agent loads it) resumes after the daemon was
// stopped and started again on the same authority, and does not on a
// daemon with another authority (a full handshake then succeeds).
func TestSessionResumptionAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	pkiDir := filepath.Join(dir, "pki")
	start := func(db string) (string, func()) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		readyc := make(chan string, 1)
		th := &testHooks{ready: func(d *daemon.Daemon, ls []serversetup.Listener) { readyc <- ls[0].Addr().String() }}
		var logs syncBuffer
		done := make(chan int, 1)
		go func() {
			done <- run(ctx, []string{"--dev-pki", pkiDir, "--listen", "127.0.0.1:0", "--sqlite", db,
				"--log-format", "json", "--shutdown-timeout", "2s"}, io.Discard, &logs, th)
		}()
		select {
		case addr := <-readyc:
			return addr, func() {
				cancel()
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					t.Fatal("daemon did not shut down")
				}
			}
		case code := <-done:
			cancel()
			t.Fatalf("daemon exited %d before ready: %s", code, logs.String())
		case <-time.After(10 * time.Second):
			cancel()
			t.Fatal("daemon not ready")
		}
		return "", nil
	}
	db := filepath.Join(dir, "a.db")
	addr, stop := start(db)
	var cp config.ControlPlane
	if _, err := agentsetup.DevAgent(pkiDir, "a1", &cp); err != nil {
		t.Fatal(err)
	}
	cred, err := agentsetup.LoadCredential(cp)
	if err != nil {
		t.Fatal(err)
	}
	if cred.Client.ClientSessionCache == nil {
		t.Fatal("the agent credential has no session cache")
	}
	stored := make(chan struct{}, 8)
	cred.Client.ClientSessionCache = trusttest.NotifyingCache{ClientSessionCache: cred.Client.ClientSessionCache, Stored: stored}
	dial := func(addr string) bool {
		t.Helper()
		e, err := config.ParseEndpoint("quic://" + addr)
		if err != nil {
			t.Fatal(err)
		}
		d, daddr, err := agentsetup.Dialer(e, cred.Client, quic.Config{}, yamux.Config{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		bc, err := d.Dial(ctx, daddr)
		if err != nil {
			t.Fatal(err)
		}
		defer bc.CloseWithCode(wire.CloseNormal, "done")
		select {
		case <-stored:
		case <-ctx.Done():
			t.Fatal("the daemon sent no session ticket")
		}
		return bc.ConnectionState().DidResume
	}
	if dial(addr) {
		t.Fatal("the first connection resumed")
	}
	if !dial(addr) {
		t.Fatal("the second connection did not resume")
	}
	stop()
	addr, stop = start(db)
	if !dial(addr) {
		t.Fatal("after a restart on the same authority the agent did not resume")
	}
	stop()
	addr, stop = start(filepath.Join(dir, "other.db"))
	defer stop()
	if dial(addr) {
		t.Fatal("a daemon with another authority's ticket keys accepted the ticket")
	}
}

// TestTLSResumedMetric: the daemon command's hook counts a registered
// transport that resumed its TLS session once (not a full handshake, not
// a second registration on the same transport).
func TestTLSResumedMetric(t *testing.T) {
	tel := newDaemonTelemetry()
	h := tel.hooks(daemon.Hooks{})
	resumed := daemon.SessionInfo{Backend: "quic", Transport: wire.NewTransportSessionId(), Epoch: 1, TLSResumed: true}
	h.OnRegistered(resumed)
	h.OnRegistered(resumed) // the same transport again
	h.OnRegistered(daemon.SessionInfo{Backend: "quic", Transport: wire.NewTransportSessionId(), Epoch: 1})
	srv := httptest.NewServer(tel.m.Handler())
	defer srv.Close()
	_, _, body := httpGet(t, srv.URL)
	if !strings.Contains(body, `forgeyard_transport_tls_resumed_total{backend="quic"} 1`+"\n") ||
		!strings.Contains(body, `forgeyard_transport_connections_total{backend="quic"} 2`+"\n") {
		t.Fatalf("metrics:\n%s", body)
	}
}
