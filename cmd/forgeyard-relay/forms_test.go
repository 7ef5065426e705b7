package main

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/agentsetup"
	"forgeyard.dev/transport/relay"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
)

// TestRelayServesBothYamuxFormsOnOnePort: the relay's one TLS+yamux
// listener (TCP 443 by default) accepts relay+yamux:// (ALPN forgeyard/1)
// and relay+yamux+upgrade:// (ALPN http/1.1 and the HTTP/1.1 Upgrade)
// alike, so agents behind a proxy that allows CONNECT to 443 only, and
// those behind an HTTP-aware middlebox, use the same port.
func TestRelayServesBothYamuxFormsOnOnePort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pkiDir := filepath.Join(t.TempDir(), "pki")
	if _, err := trust.GenerateDevPKI(pkiDir, trust.DevPKIOptions{Agents: []string{"a1"}}); err != nil {
		t.Fatal(err)
	}
	readyc := make(chan net.Addr, 1)
	th := &testHooks{ready: func(_ *relay.Relay, ls map[string]net.Addr, _ string) { readyc <- ls[config.BackendYamux] }}
	rctx, stop := context.WithCancel(ctx)
	exited := make(chan int, 1)
	go func() {
		// No daemon: the test is about the agent-facing handshake only.
		exited <- run(rctx, []string{"--dev-pki", pkiDir, "--listen-yamux", "127.0.0.1:0", "--upstream", "quic://127.0.0.1:9",
			"--dial-timeout", "200ms", "--shutdown-timeout", "1s"}, io.Discard, io.Discard, th)
	}()
	defer func() { stop(); <-exited }()
	var addr net.Addr
	select {
	case addr = <-readyc:
	case code := <-exited:
		t.Fatalf("relay exited %d", code)
	case <-ctx.Done():
		t.Fatal("relay not ready")
	}
	var cp config.ControlPlane
	if _, err := agentsetup.DevAgent(pkiDir, "a1", &cp); err != nil {
		t.Fatal(err)
	}
	cred, err := agentsetup.LoadCredential(cp)
	if err != nil {
		t.Fatal(err)
	}
	for _, scheme := range []string{"relay+yamux", "relay+yamux+upgrade"} {
		e, err := config.ParseEndpoint(scheme + "://" + addr.String())
		if err != nil {
			t.Fatal(err)
		}
		tc := cred.Client.Clone()
		tc.ServerName = "localhost"
		d, a, err := agentsetup.Dialer(e, tc, quic.Config{}, yamux.Config{})
		if err != nil {
			t.Fatal(err)
		}
		c, err := d.Dial(ctx, a)
		if err != nil {
			t.Fatalf("%s: %v", scheme, err)
		}
		want := yamux.ALPN
		if e.Upgrade {
			want = yamux.ALPNHTTP1
		}
		if got := c.ConnectionState().NegotiatedProtocol; got != want {
			t.Errorf("%s: ALPN %q, want %q", scheme, got, want)
		}
		_ = c.CloseWithCode(wire.CloseNormal, "done")
	}
}
