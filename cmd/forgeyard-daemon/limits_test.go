package main

import (
	"context"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/agentsetup"
	"forgeyard.dev/transport/internal/setup/daemonsetup"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// TestMaxStreamsReachesBackends: [limits] max_streams = 1000 in the
// daemon's TOML reaches the stream credit of the listeners the daemon
// builds (listenerConfigs, serversetup.Listen): QUIC and WebTransport grant
// max_streams + 16 refusals = 1016 streams of each type, so a client opens
// 1000 at once without blocking (the default credit, 272, would block the
// 273rd until the deadline), and yamux's accept backlog and stream cap hold
// 1016.
func TestMaxStreamsReachesBackends(t *testing.T) {
	cfg, err := config.ParseDaemon("d.toml", []byte(`
[tls]
certificate = "s.pem"
private_key = "k.pem"
client_ca = "ca.pem"
[authority]
sqlite = "a.db"
[limits]
max_streams = 1000
`))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := daemonsetup.Limits(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if lim.Conn.WithDefaults().MaxStreams != 1000 {
		t.Fatalf("daemon limits %+v", lim.Conn)
	}
	qcfg, ycfg := listenerConfigs(lim.Conn, nil, nil)
	const credit = 1000 + semantics.DefaultMaxRefusals
	if q := qcfg.WithDefaults(); q.MaxIncomingStreams != credit || q.MaxIncomingUniStreams != credit {
		t.Errorf("QUIC credit %d/%d, want %d", q.MaxIncomingStreams, q.MaxIncomingUniStreams, credit)
	}
	if y := ycfg.WithDefaults(); y.AcceptBacklog < credit || y.MaxIncomingStreams < credit {
		t.Errorf("yamux accept backlog %d, stream cap %d, want ≥ %d", y.AcceptBacklog, y.MaxIncomingStreams, credit)
	}

	pki := trusttest.NewPKI(t)
	const name = "daemon.forgeyard.test"
	ls, err := serversetup.Listen(config.Listen{QUIC: "127.0.0.1:0", WebTransport: "127.0.0.1:0"}, pki.ServerConfig(t, name), qcfg, ycfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		t.Run(l.Backend, func(t *testing.T) {
			defer l.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			acc := make(chan semantics.BackendConn, 1)
			go func() {
				c, err := l.Accept(ctx)
				if err != nil {
					t.Errorf("Accept: %v", err)
				}
				acc <- c
			}()
			e, err := config.ParseEndpoint(l.Backend + "://" + l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			d, addr, err := agentsetup.Dialer(e, pki.ClientConfig(t, wire.NewRunnerId(), name), quic.Config{}, yamux.Config{})
			if err != nil {
				t.Fatal(err)
			}
			c, err := d.Dial(ctx, addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.CloseWithCode(wire.CloseNormal, "")
			if s := <-acc; s != nil {
				defer s.CloseWithCode(wire.CloseNormal, "")
			}
			for i := range 1000 {
				if _, err := c.OpenStream(ctx); err != nil {
					t.Fatalf("OpenStream %d of 1000: %v", i+1, err)
				}
				if _, err := c.OpenUniStream(ctx); err != nil {
					t.Fatalf("OpenUniStream %d of 1000: %v", i+1, err)
				}
			}
		})
	}
}
