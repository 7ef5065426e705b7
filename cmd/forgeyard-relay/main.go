// Command forgeyard-relay carries agents that cannot reach a daemon over
// QUIC: it accepts them over TLS+yamux (TCP) and/or WebTransport (HTTP/3,
// UDP 443) and opens one QUIC connection per agent to the first reachable
// daemon endpoint, copying streams and close codes both ways (package
// relay, docs/protocols/internal/relay.md). It carries bytes, not
// identity: agents still prove their key to the daemon end to end.
//
//	forgeyard-relay --config /etc/forgeyard/relay.toml
//	forgeyard-relay --dev-pki ./.dev-pki --listen-yamux 127.0.0.1:443 --upstream 127.0.0.1:7443
//
// Flags override the configuration file (see --help and
// docs/operations.md, "Running forgeyard-relay").
//
// With --admin-listen (key admin.listen) it serves GET /metrics
// (Prometheus: forgeyard_relay_* and the Go runtime) and GET /healthz
// (JSON; 503 once shutting down), loopback only unless admin.allow_remote.
//
// SIGINT or SIGTERM shuts down gracefully: the listeners close and every
// relayed connection is closed on both sides with CloseShutdown, so agents
// reconnect elsewhere at once.
//
// Exit status: 0 after a clean shutdown, 1 on a runtime failure, 2 on a
// usage or configuration error.
package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/internal/buildinfo"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/relaysetup"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/relay"
	"forgeyard.dev/transport/semantics/telemetry"
)

func main() {
	cli.Main(func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
		return run(ctx, args, stdout, stderr, nil)
	})
}

// testHooks let tests observe the running relay; nil in production.
type testHooks struct {
	ready func(r *relay.Relay, ls map[string]net.Addr, admin string)
}

type flags struct {
	cli.RoleFlags // --config, --log-*
	listenYamux   string
	listenWT      string
	cert, key, ca string
	upstreams     string
	upstreamCA    string
	upstreamCert  string
	upstreamKey   string
	serverName    string
	dialTimeout   time.Duration
	maxConns      int
	maxStreams    int
	devPKI        string
	adminListen   string
	adminRemote   bool
	shutdown      time.Duration
}

func newFlagSet(f *flags, out io.Writer) *flag.FlagSet {
	fs := cli.NewRoleFlagSet("forgeyard-relay", out, &f.RoleFlags, true)
	fs.StringVar(&f.listenYamux, "listen-yamux", "", "agent-facing TLS+yamux listen `host:port`, raw and HTTP/1.1 Upgrade form on one port (key: listen.yamux; default "+config.DefaultRelayListenYamux+" when no listener is configured)")
	fs.StringVar(&f.listenWT, "listen-webtransport", "", "agent-facing WebTransport listen `host:port`, UDP (key: listen.webtransport)")
	fs.StringVar(&f.cert, "cert", "", "agent-facing server certificate PEM `file` (key: tls.certificate)")
	fs.StringVar(&f.key, "key", "", "agent-facing server private key PEM `file` (key: tls.private_key)")
	fs.StringVar(&f.ca, "client-ca", "", "CA PEM `file` that signs agent certificates (key: tls.client_ca)")
	fs.StringVar(&f.upstreams, "upstream", "", "comma-separated daemon QUIC endpoints, tried in order (key: upstream.endpoints), e.g. quic://d1:7443,quic://d2:7443")
	fs.StringVar(&f.upstreamCA, "upstream-ca", "", "CA PEM `file` of the daemons' server certificates (key: upstream.ca; default: system roots)")
	fs.StringVar(&f.upstreamCert, "upstream-cert", "", "the relay's client certificate PEM `file` towards the daemons; must name no runner (key: upstream.certificate)")
	fs.StringVar(&f.upstreamKey, "upstream-key", "", "its private key PEM `file` (key: upstream.private_key)")
	fs.StringVar(&f.serverName, "upstream-server-name", "", "`name` checked in the daemons' certificates (key: upstream.server_name; default: each endpoint's host)")
	fs.DurationVar(&f.dialTimeout, "dial-timeout", 0, "bound of one dial per daemon endpoint (key: upstream.dial_timeout; default 3s)")
	fs.IntVar(&f.maxConns, "max-connections", 0, "agent connections relayed at once; beyond it agents get CloseOverloaded (key: limits.max_connections; default 10000)")
	fs.IntVar(&f.maxStreams, "max-streams-per-connection", 0, "streams in flight per agent; beyond it streams are refused (key: limits.max_streams_per_connection; default 256)")
	fs.StringVar(&f.devPKI, "dev-pki", "", "DEVELOPMENT ONLY: create/reuse a dev PKI in `dir` for both sides (server certificate, CA, relay client certificate)")
	fs.StringVar(&f.adminListen, "admin-listen", "", "serve /metrics and /healthz on `host:port` (key: admin.listen; alias --metrics-listen; loopback only unless --admin-allow-remote)")
	fs.StringVar(&f.adminListen, "metrics-listen", "", "alias of --admin-listen")
	fs.BoolVar(&f.adminRemote, "admin-allow-remote", false, "allow a non-loopback --admin-listen address; the endpoint has no authentication (key: admin.allow_remote)")
	fs.DurationVar(&f.shutdown, "shutdown-timeout", 0, "how long a graceful shutdown waits for relayed connections to close (key: shutdown_timeout; default 10s)")
	cli.SetUsage(fs, `Usage: forgeyard-relay [--config FILE] [flags]
       forgeyard-relay --version | version [--json] | completion bash|zsh|fish | man

Relays agents that cannot use QUIC (UDP blocked, or only UDP 443 open) to
daemons over QUIC. Agents connect over TLS+yamux or WebTransport; each gets
one QUIC connection to the first reachable upstream endpoint. Settings come
from the TOML file given with --config; each flag overrides one key of it.
SIGINT/SIGTERM close every relayed connection with CloseShutdown and exit.

Flags:
`, `
Examples:
  forgeyard-relay --config /etc/forgeyard/relay.toml
  forgeyard-relay --dev-pki ./.dev-pki --listen-yamux 127.0.0.1:443 --upstream 127.0.0.1:7443 --admin-listen 127.0.0.1:9465
  (agents: --endpoint relay+yamux://relay.example:443, which passes proxies that allow CONNECT to 443 only)
`)
	return fs
}

// newRoot is the command tree: the relay itself (the root's flags) and
// the standard subcommands, for dispatch, completions and the man page.
func newRoot() *cli.Command {
	return cli.RoleRoot("forgeyard-relay", "relay agents that cannot use QUIC to the daemons",
		func() *flag.FlagSet { return newFlagSet(new(flags), io.Discard) })
}

// run is main without the process; tests call it in-process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, th *testHooks) int {
	var f flags
	fs := newFlagSet(&f, stderr)
	return cli.RunRole(newRoot(), fs, args, stdout, stderr, "relay",
		func() (*config.Relay, error) { return buildConfig(fs, &f) },
		func(cfg *config.Relay, log *slog.Logger) error { return serve(ctx, cfg, log, th) })
}

// buildConfig loads the file (if any), applies the dev PKI and the flags
// that were set, the defaults, and validates.
func buildConfig(fs *flag.FlagSet, f *flags) (*config.Relay, error) {
	cfg, err := cli.LoadConfig(fs, f.ConfigFile, config.ReadRelay, func(cfg *config.Relay, set config.SetFlags) error {
		str := set.String
		if f.devPKI != "" {
			if _, err := relaysetup.DevRelay(f.devPKI, cfg); err != nil {
				return fmt.Errorf("--dev-pki: %w", err)
			}
			if cfg.Upstream.ServerName == "" && !set["upstream-server-name"] {
				cfg.Upstream.ServerName = "localhost" // the dev server certificate's name
			}
		}
		str("listen-yamux", &cfg.Listen.Yamux, f.listenYamux)
		str("listen-webtransport", &cfg.Listen.WebTransport, f.listenWT)
		str("cert", &cfg.TLS.Certificate, f.cert)
		str("key", &cfg.TLS.PrivateKey, f.key)
		str("client-ca", &cfg.TLS.ClientCA, f.ca)
		if set["upstream"] {
			cfg.Upstream.Endpoints = nil
			for _, e := range strings.Split(f.upstreams, ",") {
				if e = strings.TrimSpace(e); e != "" {
					cfg.Upstream.Endpoints = append(cfg.Upstream.Endpoints, e)
				}
			}
		}
		str("upstream-ca", &cfg.Upstream.CA, f.upstreamCA)
		str("upstream-cert", &cfg.Upstream.Certificate, f.upstreamCert)
		str("upstream-key", &cfg.Upstream.PrivateKey, f.upstreamKey)
		str("upstream-server-name", &cfg.Upstream.ServerName, f.serverName)
		if set["dial-timeout"] {
			cfg.Upstream.DialTimeout.Duration = f.dialTimeout
		}
		if set["max-connections"] {
			cfg.Limits.MaxConnections = f.maxConns
		}
		if set["max-streams-per-connection"] {
			cfg.Limits.MaxStreamsPerConnection = f.maxStreams
		}
		f.ApplyLog(&cfg.Log, set)
		str("admin-listen", &cfg.Admin.Listen, f.adminListen)
		str("metrics-listen", &cfg.Admin.Listen, f.adminListen)
		if set["admin-allow-remote"] {
			cfg.Admin.AllowRemote = f.adminRemote
		}
		if set["shutdown-timeout"] {
			cfg.ShutdownTimeout.Duration = f.shutdown
		}
		if f.dialTimeout < 0 || f.shutdown < 0 || f.maxConns < 0 || f.maxStreams < 0 {
			return errors.New("durations and limits must not be negative")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return cfg, nil
}

func serve(ctx context.Context, cfg *config.Relay, log *slog.Logger, th *testHooks) error {
	serverTLS, reloader, stopReload, err := serversetup.ReloadingServerTLS(cfg.TLS, log)
	if err != nil {
		return err
	}
	defer stopReload()
	upTLS, err := relaysetup.RelayUpstreamTLS(cfg.Upstream)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	certs := telemetry.NewCertificateCollector() // forgeyard_certificate_expiry_timestamp_seconds
	reg.MustRegister(certs)
	certs.Watch("server", reloader.Leaf)
	for _, f := range []struct{ role, path string }{{"client_ca", cfg.TLS.ClientCA}, {"upstream_client", cfg.Upstream.Certificate}, {"upstream_ca", cfg.Upstream.CA}} {
		if c := telemetry.CertificateFile(f.path)(); f.path != "" && c != nil { // read at start only, as the relay does
			certs.Watch(f.role, func() *x509.Certificate { return c })
		}
	}
	buildinfo.MustRegister(reg) // forgeyard_build_info
	r, err := relay.New(relay.Config{
		Upstreams: cfg.UpstreamAddrs(), UpstreamTLS: upTLS, UpstreamQUIC: quic.Config{Logger: log},
		DialTimeout: cfg.Upstream.DialTimeout.Duration, MaxConns: cfg.Limits.MaxConnections,
		MaxStreamsPerConn: cfg.Limits.MaxStreamsPerConnection, CopyBuffer: cfg.Limits.CopyBuffer,
		Logger: log, Registerer: reg,
	})
	if err != nil {
		return err
	}

	// The agent-facing listeners: listen.yamux, listen.webtransport (a
	// relay serves no QUIC). WebTransport sessions of a restarted relay
	// are reset at their next packet (the key derives from tls.private_key).
	resetKey, err := serversetup.ResetKey("", cfg.TLS)
	if err != nil {
		return err
	}
	ls, err := serversetup.Listen(config.Listen{Yamux: cfg.Listen.Yamux, WebTransport: cfg.Listen.WebTransport},
		serverTLS, quic.Config{Logger: log, StatelessResetKey: resetKey}, relaysetup.AgentYamuxConfig(cfg, log))
	if err != nil {
		return err
	}
	closeAll := func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}

	var draining atomic.Bool
	adminAddr := ""
	if addr := cfg.AdminListen(); addr != "" {
		adm, err := cli.ListenAdmin(addr, adminHandler(reg, r, ls, &draining), log)
		if err != nil {
			closeAll()
			return fmt.Errorf("admin.listen: %w", err)
		}
		defer adm.Stop(2 * time.Second)
		adminAddr = adm.Addr()
		log.Info("admin endpoint listening", "addr", adminAddr, "paths", "/metrics /healthz")
	}

	errc := make(chan error, len(ls))
	addrs := map[string]net.Addr{}
	for _, l := range ls {
		addrs[l.Backend] = l.Addr()
		log.Info("listening", "backend", l.Backend, "addr", l.Addr().String())
		go func() { errc <- r.Serve(context.Background(), l) }()
	}
	log.Info("relaying to daemons", "upstreams", strings.Join(cfg.UpstreamAddrs(), ","), "dial_timeout", cfg.Upstream.DialTimeout.Duration)
	if th != nil && th.ready != nil {
		th.ready(r, addrs, adminAddr)
	}

	var failed error
	select {
	case <-ctx.Done():
		log.Info("shutting down", "timeout", cfg.ShutdownTimeout.Duration)
	case failed = <-errc:
		log.Error("listener failed; shutting down", "err", failed)
	}
	draining.Store(true)
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout.Duration)
	defer cancel()
	if err := r.Shutdown(sctx); err != nil {
		log.Warn("relayed connections still open at the shutdown timeout", "err", err)
	}
	closeAll()
	st := r.Stats()
	log.Info("relay stopped", "connections", st.Accepted, "refused", st.Refused, "streams", st.Streams,
		"bytes_to_daemon", st.BytesToDaemon, "bytes_to_agent", st.BytesToAgent, "dial_failures", st.DialFailures)
	return failed
}

// health is the /healthz answer.
type health struct {
	Status    string            `json:"status"` // "ok" or "draining"
	Listeners map[string]string `json:"listeners"`
	relay.Stats
}

func adminHandler(reg *prometheus.Registry, r *relay.Relay, ls []serversetup.Listener, draining *atomic.Bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		h := health{Status: "ok", Listeners: map[string]string{}, Stats: r.Stats()}
		for _, l := range ls {
			h.Listeners[l.Backend] = l.Addr().String()
		}
		w.Header().Set("Content-Type", "application/json")
		if draining.Load() {
			h.Status = "draining"
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(h)
	})
	return mux
}
