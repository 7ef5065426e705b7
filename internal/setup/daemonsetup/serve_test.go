package daemonsetup

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/agentsetup"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// serveConfig is a validated daemon configuration in a temporary
// directory: a dev PKI, a SQLite authority, local stores, listeners l;
// edit, when not nil, changes it before the defaults and the check.
func serveConfig(t *testing.T, l config.Listen, edit func(*config.Daemon)) *config.Daemon {
	t.Helper()
	dir := t.TempDir()
	cfg := &config.Daemon{ID: "daemon-under-test", Listen: l}
	if _, err := DevDaemon(filepath.Join(dir, "pki"), &cfg.TLS); err != nil {
		t.Fatal(err)
	}
	cfg.Authority.SQLite = filepath.Join(dir, "authority.db")
	cfg.Data.CASDir, cfg.Data.LogDir = filepath.Join(dir, "cas"), filepath.Join(dir, "logs")
	if edit != nil {
		edit(cfg)
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestMaxStreamsReachesListeners: [limits] max_streams = 1000 in the
// daemon's TOML reaches the stream credit of the listeners Listen opens
// (Build's limits, listenerConfigs, serversetup.Listen): QUIC and
// WebTransport grant max_streams + 16 refusals = 1016 streams of each
// type, so a client opens 1000 at once without blocking (the default
// credit, 272, would block the 273rd until the deadline), and yamux's
// accept backlog and stream cap hold 1016.
func TestMaxStreamsReachesListeners(t *testing.T) {
	toml, err := config.ParseDaemon("d.toml", []byte(`
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
	cfg := serveConfig(t, config.Listen{QUIC: "127.0.0.1:0", WebTransport: "127.0.0.1:0"},
		func(c *config.Daemon) { c.Limits = toml.Limits })
	log := slog.New(slog.DiscardHandler)
	b, err := Build(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const credit = 1000 + semantics.DefaultMaxRefusals
	_, ycfg := listenerConfigs(b.Config.AllLimits().Conn, nil, nil)
	if y := ycfg.WithDefaults(); y.AcceptBacklog < credit || y.MaxIncomingStreams < credit {
		t.Errorf("yamux accept backlog %d, stream cap %d, want ≥ %d", y.AcceptBacklog, y.MaxIncomingStreams, credit)
	}

	// The listeners' TLS is a test PKI's, whose client certificates the
	// dial below presents; the credit is Listen's own doing.
	pki := trusttest.NewPKI(t)
	const name = "daemon.forgeyard.test"
	b.TLS = pki.ServerConfig(t, name)
	s, err := Listen(context.Background(), cfg, b, b.Config, telemetry.NewMetrics(), log)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if len(s.Listeners) != 2 {
		t.Fatalf("%d listeners, want QUIC and WebTransport", len(s.Listeners))
	}
	for _, l := range s.Listeners {
		t.Run(l.Backend, func(t *testing.T) {
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

// events records the order of the steps' callbacks.
type events struct {
	mu  sync.Mutex
	got []string
}

func (e *events) add(s string) {
	e.mu.Lock()
	e.got = append(e.got, s)
	e.mu.Unlock()
}

func (e *events) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.got)
}

// TestServeSteps: Listen, StartAdmin, Accept and Wait on loopback ports
// serve and stop in order: the admin endpoint answers while the daemon
// runs; when ctx ends, draining comes first, then every accept loop ends
// (its listener closed), and Wait returns nil; the admin endpoint serves
// until Stop. Afterwards nothing of them runs.
func TestServeSteps(t *testing.T) {
	opts := []goleak.Option{goleak.IgnoreCurrent()}
	cfg := serveConfig(t, config.Listen{QUIC: "127.0.0.1:0", Yamux: "127.0.0.1:0"},
		func(c *config.Daemon) { c.Admin.Listen = "127.0.0.1:0" })
	log := slog.New(slog.DiscardHandler)
	b, err := Build(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Listen(context.Background(), cfg, b, b.Config, telemetry.NewMetrics(), log)
	if err != nil {
		t.Fatal(err)
	}
	var tokens []string
	adm, err := StartAdmin(cfg, b.Certs.Leaf, AdminHandlers{
		TCP: func(token string) http.Handler {
			tokens = append(tokens, token)
			return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") })
		},
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	if len(tokens) != 1 || tokens[0] != "" || adm.Addr() == "" {
		t.Fatalf("TCP handler built for tokens %q, address %q: want one, without a token", tokens, adm.Addr())
	}
	var ev events
	s.Accept(nil, func(i int, err error) { ev.add(fmt.Sprintf("listener %d ended", i)) })
	for _, l := range s.Listeners {
		if strings.HasSuffix(l.Addr().String(), ":0") {
			t.Errorf("%s listens on %s", l.Backend, l.Addr())
		}
	}
	get := func() error {
		r, err := http.Get("http://" + adm.Addr() + "/")
		if err == nil {
			r.Body.Close()
		}
		return err
	}
	if err := get(); err != nil {
		t.Fatalf("admin endpoint while serving: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Wait(ctx, 5*time.Second, func() { ev.add("draining") }); err != nil {
		t.Errorf("Wait after ctx ended: %v", err)
	}
	got := ev.list()
	if len(got) != 3 || got[0] != "draining" || !slices.Contains(got, "listener 0 ended") || !slices.Contains(got, "listener 1 ended") {
		t.Errorf("events %q: want draining, then both accept loops' end", got)
	}
	if err := get(); err != nil {
		t.Errorf("admin endpoint after the drain, before Stop: %v", err)
	}
	adm.Stop()
	if err := get(); err == nil {
		t.Error("admin endpoint still serving after Stop")
	}
	s.Close()
	b.Close()
	goleak.VerifyNone(t, opts...)
}

// TestServeStepsUndo: a step that fails stops what it started, and
// Serving.Close stops the daemon that a later step's failure left: Listen
// on a port in use, StartAdmin with a regular file at admin.socket (its
// TCP endpoint, started first, is closed again).
func TestServeStepsUndo(t *testing.T) {
	opts := []goleak.Option{goleak.IgnoreCurrent()}
	log := slog.New(slog.DiscardHandler)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := serveConfig(t, config.Listen{QUIC: "127.0.0.1:0", Yamux: taken.Addr().String()}, nil)
	b, err := Build(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(context.Background(), cfg, b, b.Config, telemetry.NewMetrics(), log); err == nil || !strings.Contains(err.Error(), "listen.yamux") {
		t.Errorf("Listen on a port in use: %v", err)
	}
	b.Close()
	goleak.VerifyNone(t, opts...)

	sock := filepath.Join(t.TempDir(), "admin.sock")
	if err := os.WriteFile(sock, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg = serveConfig(t, config.Listen{QUIC: "127.0.0.1:0"}, func(c *config.Daemon) {
		c.Admin.Listen, c.Admin.Socket = "127.0.0.1:0", sock
	})
	if b, err = Build(context.Background(), cfg, log); err != nil {
		t.Fatal(err)
	}
	s, err := Listen(context.Background(), cfg, b, b.Config, telemetry.NewMetrics(), log)
	if err != nil {
		t.Fatal(err)
	}
	var tcpAddr string
	h := http.NotFoundHandler()
	_, err = StartAdmin(cfg, b.Certs.Leaf, AdminHandlers{
		TCP:    func(string) http.Handler { return h },
		Socket: func() http.Handler { return h },
	}, slog.New(slog.NewTextHandler(logAddr{&tcpAddr}, nil)))
	if err == nil || !strings.Contains(err.Error(), "admin.socket") {
		t.Errorf("StartAdmin with a regular file as the socket: %v", err)
	}
	if tcpAddr == "" {
		t.Error("the TCP endpoint did not start before the socket failed")
	} else if c, err := net.Dial("tcp", tcpAddr); err == nil {
		c.Close()
		t.Errorf("the TCP endpoint %s still accepts after StartAdmin failed", tcpAddr)
	}
	s.Close()
	b.Close()
	goleak.VerifyNone(t, opts...)
}

// logAddr catches the address of the "admin endpoint listening" record.
type logAddr struct{ addr *string }

func (l logAddr) Write(p []byte) (int, error) {
	if line := string(p); strings.Contains(line, "admin endpoint listening") {
		if _, rest, ok := strings.Cut(line, " addr="); ok {
			*l.addr, _, _ = strings.Cut(rest, " ")
		}
	}
	return len(p), nil
}
