// Command forgeyard-daemon runs the Forgeyard Transport daemon: it accepts
// agents over QUIC (and optionally TLS+yamux and WebTransport), registers
// them against the authority (SQLite or PostgreSQL) and runs the control
// protocol (semantics/daemon).
//
//	forgeyard-daemon --config /etc/forgeyard/daemon.toml
//	forgeyard-daemon --dev-pki ./.dev-pki --sqlite ./authority.db --listen 127.0.0.1:7443
//
// Flags override the configuration file (see --help and
// docs/operations.md, "Daemon and agent configuration"). The daemon has no
// scheduler of its own; --demo-leases N is a development feature that
// offers N synthetic leases to every newly registered agent session.
//
// With --admin-listen (key admin.listen, loopback only unless
// admin.allow_remote) and/or --admin-socket (admin.socket, a mode-0600
// unix socket) the daemon serves an operator HTTP endpoint: GET /metrics
// (Prometheus), /healthz (telemetry.DaemonHealth; 503 when down), /status,
// /sessions and /protocols (JSON, see internal/adminapi), read by
// `forgeyard transport status|sessions|protocols|doctor`. TCP clients need
// the bearer token of --admin-token-file for all but /healthz (and
// /metrics with --admin-public-metrics).
//
// SIGINT or SIGTERM shuts down gracefully: listeners close, agents get
// GoAway with a jittered reconnect hint and the alternate endpoints, and
// the daemon waits up to --shutdown-timeout for them to leave.
//
// Exit status: 0 after a clean shutdown, 1 on a runtime failure, 2 on a
// usage or configuration error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/demoscheduler"
	"forgeyard.dev/transport/internal/setup/daemonsetup"
	"forgeyard.dev/transport/internal/setup/otlpsetup"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

func main() {
	cli.Main(func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
		return run(ctx, args, stdout, stderr, nil)
	})
}

// testHooks let tests observe the running daemon; nil in production.
type testHooks struct {
	ready        func(d *daemon.Daemon, ls []serversetup.Listener)
	admin        func(addr string) // the admin endpoint is serving on addr
	onCompletion func(daemon.CompletionEvent)
}

type flags struct {
	cli.RoleFlags   // --config, --log-*
	id              string
	listen          string
	listenYamux     string
	listenWT        string
	cert, key, ca   string
	devPKI          string
	sqlite          string
	pgDSNFile       string
	demoLeases      int
	logDir          string
	casDir          string
	adminListen     string
	adminRemote     bool
	adminSocket     string
	adminTokenFile  string
	adminPublicMet  bool
	adminPprof      bool
	shutdownTimeout time.Duration
	protocol        string
	matrixDriver    bool
	otlpEndpoint    string
}

func newFlagSet(f *flags, out io.Writer) *flag.FlagSet {
	fs := cli.NewRoleFlagSet("forgeyard-daemon", out, &f.RoleFlags, true)
	fs.StringVar(&f.id, "id", "", "daemon name in logs and session records (key: id)")
	fs.StringVar(&f.listen, "listen", "", "QUIC listen `host:port` (key: listen.quic; default "+config.DefaultDaemonListen+" when no backend is configured)")
	fs.StringVar(&f.listenYamux, "listen-yamux", "", "TLS+yamux listen `host:port` (key: listen.yamux)")
	fs.StringVar(&f.listenWT, "listen-webtransport", "", "WebTransport listen `host:port` (key: listen.webtransport)")
	fs.StringVar(&f.cert, "cert", "", "server certificate PEM `file` (key: tls.certificate)")
	fs.StringVar(&f.key, "key", "", "server private key PEM `file` (key: tls.private_key)")
	fs.StringVar(&f.ca, "client-ca", "", "CA PEM `file` that signs agent certificates (key: tls.client_ca)")
	fs.StringVar(&f.devPKI, "dev-pki", "", "DEVELOPMENT ONLY: create/reuse a dev PKI in `dir` and use its server certificate and CA")
	fs.StringVar(&f.sqlite, "sqlite", "", "SQLite authority database `file` (key: authority.sqlite)")
	fs.StringVar(&f.pgDSNFile, "postgres-dsn-file", "", "`file` holding the PostgreSQL DSN (key: authority.postgres_dsn_file)")
	fs.StringVar(&f.logDir, "log-dir", "", "store the attempts' logs received on log streams in `dir` (key: data.log_dir; one file per attempt; default: logs beside --dev-pki or the SQLite authority; with PostgreSQL and no store, log streams are refused)")
	fs.StringVar(&f.casDir, "cas-dir", "", "store CAS objects agents upload, and serve payloads from, `dir` (key: data.cas_dir; default: cas beside --dev-pki or the SQLite authority; with PostgreSQL and no store, CAS streams are refused)")
	fs.IntVar(&f.demoLeases, "demo-leases", 0, "DEVELOPMENT ONLY: offer `N` synthetic leases to every newly registered agent session")
	fs.StringVar(&f.adminListen, "admin-listen", "", "serve the admin endpoint (/healthz, /metrics, /status, /sessions, /protocols) on `host:port` (key: admin.listen; a missing host means 127.0.0.1; loopback only unless --admin-allow-remote)")
	fs.StringVar(&f.adminTokenFile, "admin-token-file", "", "`file` holding the bearer token --admin-listen clients must send for every path but /healthz (key: admin.token_file; without it TCP serves only /healthz and /metrics)")
	fs.BoolVar(&f.adminPublicMet, "admin-public-metrics", false, "let --admin-listen clients scrape /metrics without the token (key: admin.public_metrics)")
	fs.StringVar(&f.adminSocket, "admin-socket", "", "also serve the admin endpoint on a unix socket at `path`, mode 0600, no token needed (key: admin.socket)")
	fs.BoolVar(&f.adminPprof, "admin-pprof", false, "serve Go's runtime profiles under /debug/pprof/ on the admin endpoint, with the access of /status: the socket, or the bearer token over TCP (key: admin.pprof)")
	fs.BoolVar(&f.adminRemote, "admin-allow-remote", false, "allow a non-loopback --admin-listen address; needs --admin-token-file (key: admin.allow_remote)")
	fs.StringVar(&f.protocol, "protocol", "", "protocol `range` MIN-MAX this daemon accepts, e.g. 1.0-1.0 (keys: protocol_min, protocol_max; default: all this build supports)")
	fs.BoolVar(&f.matrixDriver, "matrix-driver", false, "TESTING ONLY: serve the compatibility-matrix driver under /v1/matrix/ on --admin-listen (offer, cancel, cut, read back; logs kept in memory)")
	fs.StringVar(&f.otlpEndpoint, "otlp-endpoint", "", "export traces over OTLP to the collector at `URL`, e.g. http://127.0.0.1:4318 (key: telemetry.otlp_endpoint; default: OTEL_EXPORTER_OTLP_ENDPOINT, else off)")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long a graceful shutdown waits for agents to leave")
	cli.SetUsage(fs, `Usage: forgeyard-daemon [--config FILE] [flags]
       forgeyard-daemon --version | version [--json] | completion bash|zsh|fish | man

Runs the Forgeyard Transport daemon. Settings come from the TOML file given
with --config; each flag below overrides one key of it. Secrets (keys, DSNs)
are always file paths. SIGINT/SIGTERM drain agents and exit.

Flags:
`, `
Examples:
  forgeyard-daemon --config /etc/forgeyard/daemon.toml
  forgeyard-daemon --dev-pki ./.dev-pki --sqlite ./authority.db --listen 127.0.0.1:7443 --demo-leases 3
  forgeyard-daemon --config /etc/forgeyard/daemon.toml --admin-listen 127.0.0.1:9464 --admin-token-file /etc/forgeyard/admin.token
  forgeyard-daemon --config /etc/forgeyard/daemon.toml --admin-socket /run/forgeyard/admin.sock
`)
	return fs
}

// newRoot is the command tree: the daemon itself (the root's flags) and
// the standard subcommands, for dispatch, completions and the man page.
func newRoot() *cli.Command {
	return cli.RoleRoot("forgeyard-daemon", "run the Forgeyard Transport daemon",
		func() *flag.FlagSet { return newFlagSet(new(flags), io.Discard) })
}

// run is main without the process; tests call it in-process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, th *testHooks) int {
	var f flags
	fs := newFlagSet(&f, stderr)
	build := func() (*config.Daemon, error) {
		if f.demoLeases < 0 || f.demoLeases > 10000 {
			return nil, errors.New("--demo-leases must be 0–10000")
		}
		return buildConfig(fs, &f)
	}
	return cli.RunRole(newRoot(), fs, args, stdout, stderr, "daemon", build,
		func(cfg *config.Daemon, log *slog.Logger) error { return serve(ctx, cfg, &f, log, th) })
}

// buildConfig loads the file (if any), applies the flags that were set,
// the dev PKI and the defaults, and validates.
func buildConfig(fs *flag.FlagSet, f *flags) (*config.Daemon, error) {
	cfg, err := cli.LoadConfig(fs, f.ConfigFile, config.ReadDaemon, func(cfg *config.Daemon, set config.SetFlags) error {
		str := set.String
		str("id", &cfg.ID, f.id)
		str("listen", &cfg.Listen.QUIC, f.listen)
		str("listen-yamux", &cfg.Listen.Yamux, f.listenYamux)
		str("listen-webtransport", &cfg.Listen.WebTransport, f.listenWT)
		if f.devPKI != "" {
			pki, err := daemonsetup.DevDaemon(f.devPKI, &cfg.TLS)
			if err != nil {
				return fmt.Errorf("--dev-pki: %w", err)
			}
			if cfg.Enrollment.IssuerCertificate == "" { // development: the dev CA signs enrolled runners
				cfg.Enrollment.IssuerCertificate, cfg.Enrollment.IssuerPrivateKey = pki.CA.CertFile, pki.CA.KeyFile
			}
		}
		str("cert", &cfg.TLS.Certificate, f.cert)
		str("key", &cfg.TLS.PrivateKey, f.key)
		str("client-ca", &cfg.TLS.ClientCA, f.ca)
		if set["sqlite"] {
			cfg.Authority = config.AuthorityConfig{SQLite: f.sqlite}
		}
		if set["postgres-dsn-file"] {
			cfg.Authority = config.AuthorityConfig{PostgresDSNFile: f.pgDSNFile}
		}
		str("log-dir", &cfg.Data.LogDir, f.logDir)
		str("cas-dir", &cfg.Data.CASDir, f.casDir)
		f.ApplyLog(&cfg.Log, set)
		str("admin-listen", &cfg.Admin.Listen, f.adminListen)
		if set["protocol"] {
			r, err := wire.ParseRange(f.protocol)
			if err != nil {
				return fmt.Errorf("--protocol: %w", err)
			}
			cfg.ProtocolMin.ProtocolVersion, cfg.ProtocolMax.ProtocolVersion = r.Min, r.Max
		}
		str("admin-socket", &cfg.Admin.Socket, f.adminSocket)
		str("admin-token-file", &cfg.Admin.TokenFile, f.adminTokenFile)
		if set["admin-public-metrics"] {
			cfg.Admin.PublicMetrics = f.adminPublicMet
		}
		str("otlp-endpoint", &cfg.Telemetry.OTLPEndpoint, f.otlpEndpoint)
		if set["admin-pprof"] {
			cfg.Admin.Pprof = f.adminPprof
		}
		if set["admin-allow-remote"] {
			cfg.Admin.AllowRemote = f.adminRemote
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The limit keys ([limits], [admission], [data]) are checked by the
	// daemon's own rules, which config.Daemon.Validate does not link:
	// refuse an invalid one here, naming the file and key, before anything
	// starts (serve converts them again for the engine).
	if _, err := daemonsetup.Limits(cfg); err != nil {
		return nil, config.WithFile(err, f.ConfigFile)
	}
	if f.matrixDriver && (cfg.AdminListen() == "" || cfg.Admin.AllowRemote) {
		return nil, errors.New("--matrix-driver needs a loopback --admin-listen (and no admin.allow_remote)")
	}
	if cfg.ID == "" {
		cfg.ID = defaultID(cfg.Listen)
	}
	if cfg.Data.Store != config.StoreS3 && cfg.Data.CASDir == "" {
		cfg.Data.CASDir = defaultDataDir(f.devPKI, cfg.Authority.SQLite, "cas")
	}
	if cfg.Data.Store != config.StoreS3 && cfg.Data.LogDir == "" {
		cfg.Data.LogDir = defaultDataDir(f.devPKI, cfg.Authority.SQLite, "logs")
	}
	return cfg, nil
}

// defaultDataDir is where a daemon with no configured store keeps the
// blobs agents upload (name "cas") or the attempts' logs ("logs"): beside
// its development PKI (the quick start), else beside its SQLite authority
// (its data directory); "" with PostgreSQL, whose HA daemons need a shared
// store ([data] store = "s3").
func defaultDataDir(devPKI, sqlite, name string) string {
	switch {
	case devPKI != "":
		return filepath.Join(devPKI, name)
	case sqlite != "" && sqlite != ":memory:" && !strings.HasPrefix(sqlite, "file:"):
		return filepath.Join(filepath.Dir(sqlite), name)
	}
	return ""
}

// defaultID is the daemon's id when none is configured: the host name and
// the first listen address. It must survive a restart, so that the
// restarted process finds the sessions of the one before it (restart
// hints), and differ between the daemons of one host (they listen on
// different ports).
func defaultID(l config.Listen) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	for _, a := range []string{l.QUIC, l.WebTransport, l.Yamux} {
		if a != "" {
			return host + "/" + a
		}
	}
	return host + "/" + config.DefaultDaemonListen
}

// serve runs the daemon: the start-up steps of daemonsetup (Build,
// Instrument, Listen, StartAdmin, Accept) with this command's hooks,
// telemetry, matrix driver and demo scheduler between them, then waits and
// shuts down (Wait). Each step that fails stops what it started; the
// deferred calls stop the rest, in reverse order.
func serve(ctx context.Context, cfg *config.Daemon, f *flags, log *slog.Logger, th *testHooks) error {
	b, err := daemonsetup.Build(ctx, cfg, log) // TLS, runner CAs, identity, authority, session tickets, stores
	if err != nil {
		return err
	}
	defer b.Close()
	dcfg := b.Config
	drv, err := startDriver(f, &dcfg, log)
	if err != nil {
		return err
	}
	if drv != nil {
		defer drv.close()
	}
	var demo *demoscheduler.Scheduler
	logHooks(&dcfg, log, th, &demo)
	tel := newDaemonTelemetry()
	tracing, err := instrument(ctx, cfg, &dcfg, tel, drv, log)
	if err != nil {
		return err
	}
	defer otlpsetup.Flush(tracing) // the last spans (bounded: the collector may be gone)
	s, err := daemonsetup.Listen(ctx, cfg, b, dcfg, tel.m, log)
	if err != nil {
		return err
	}
	defer s.Close()
	var track func(semantics.BackendConn) func()
	if drv != nil {
		drv.d, track = s.Daemon, drv.track
	}
	if f.demoLeases > 0 {
		log.Warn("--demo-leases is a development feature: offering synthetic leases to every agent", "per_session", f.demoLeases)
		demo = demoscheduler.New(s.Daemon, f.demoLeases, log)
	}
	adm, err := startAdmin(cfg, &dcfg, tel, s, b, drv, log, th)
	if err != nil {
		return err
	}
	defer adm.Stop() // after the drain: /healthz and /status report it
	s.Accept(track, tel.listenerDone)
	if th != nil && th.ready != nil {
		th.ready(s.Daemon, s.Listeners)
	}
	return s.Wait(ctx, f.shutdownTimeout, func() {
		tel.draining.Store(true)
		if demo != nil {
			demo.Stop()
		}
	})
}

// startDriver is the --matrix-driver step: the driver, the daemon's logs
// and CAS objects kept for its read-back; nil without the flag. The caller
// closes it.
func startDriver(f *flags, dcfg *daemon.Config, log *slog.Logger) (*matrixDriver, error) {
	if !f.matrixDriver {
		return nil, nil
	}
	drv, err := newMatrixDriver(dcfg.Protocol, dcfg.Features)
	if err != nil {
		return nil, err
	}
	if err := drv.configure(dcfg); err != nil {
		drv.close()
		return nil, err
	}
	log.Warn("--matrix-driver is a testing feature: /v1/matrix/ on the admin endpoint offers leases and cuts connections")
	return drv, nil
}

// logHooks is the hooks step: the daemon's events logged and passed to
// the demo scheduler (*demo, once it exists) and the test hooks.
func logHooks(dcfg *daemon.Config, log *slog.Logger, th *testHooks, demo **demoscheduler.Scheduler) {
	dcfg.Hooks.OnRegistered = func(s daemon.SessionInfo) {
		log.Info("agent registered", "runner", s.Runner, "session", s.Session, "epoch", s.Epoch, "backend", s.Backend, "remote", s.Remote, "protocol", s.Protocol, "agent_version", s.AgentVersion)
		if *demo != nil {
			(*demo).Registered(s)
		}
	}
	dcfg.Hooks.OnDisconnect = func(s daemon.SessionInfo, err error) {
		log.Info("agent disconnected", "runner", s.Runner, "session", s.Session, "transport", s.Transport, "err", err)
	}
	dcfg.Hooks.OnCapabilities = func(s daemon.SessionInfo, c agentwire.RunnerCapabilitiesV1) {
		if *demo != nil {
			(*demo).Capabilities(s, c)
		}
	}
	dcfg.Hooks.OnOutputs = func(e daemon.OutputsEvent) {
		refs, size := make([]string, len(e.Outputs)), uint64(0)
		for i, r := range e.Outputs {
			refs[i], size = r.String(), size+r.Size
		}
		log.Info("outputs stored", "runner", e.Runner, "attempt", e.Attempt, "lease", e.Lease, "outputs", refs, "bytes", size)
	}
	dcfg.Hooks.OnCompletion = func(e daemon.CompletionEvent) {
		log.Info("attempt completed", "runner", e.Runner, "attempt", e.Attempt, "lease", e.Lease, "ack", e.Ack)
		if *demo != nil {
			(*demo).Completed(e)
		}
		if th != nil && th.onCompletion != nil {
			th.onCompletion(e)
		}
	}
}

// instrument is the telemetry step: the metrics hooks (and the matrix
// driver's) around the logging hooks, trace export, then
// daemonsetup.Instrument. The caller flushes the returned tracing at its
// end.
func instrument(ctx context.Context, cfg *config.Daemon, dcfg *daemon.Config, tel *daemonTelemetry, drv *matrixDriver, log *slog.Logger) (*telemetry.Tracing, error) {
	dcfg.Hooks = tel.hooks(dcfg.Hooks)
	if drv != nil {
		dcfg.Hooks = drv.hooks(dcfg.Hooks)
	}
	tracing, export, err := otlpsetup.TracingEnv(ctx, cfg.Telemetry, "forgeyard-daemon", os.Getenv)
	if err != nil {
		return nil, err
	}
	if export.Endpoint != "" {
		log.Info("trace export", "endpoint", export.Endpoint, "protocol", export.Protocol, "from", export.Source, "sampler", export.Sampler)
	}
	daemonsetup.Instrument(cfg, dcfg, tel.m, tracing)
	return tracing, nil
}

// startAdmin is the admin API step: the telemetry's view of the daemon,
// its listeners and their handshake failures, then daemonsetup.StartAdmin
// with the telemetry's handlers.
func startAdmin(cfg *config.Daemon, dcfg *daemon.Config, tel *daemonTelemetry, s *daemonsetup.Serving, b *daemonsetup.Built, drv *matrixDriver, log *slog.Logger, th *testHooks) (*daemonsetup.Admin, error) {
	tel.setHandshakeFailures(s.HandshakeFailures)
	tel.attach(s.Daemon, s.Listeners, b.Certs.Leaf)
	tel.info = adminInfo{id: cfg.ID, startedAt: time.Now(), au: b.Authority, auBackend: authorityBackend(cfg.Authority),
		protocol: dcfg.Protocol, minProtocol: dcfg.MinProtocol, features: dcfg.Features}
	if drv != nil {
		tel.matrix = drv.handler()
	}
	tel.pprof = cfg.Admin.Pprof
	adm, err := daemonsetup.StartAdmin(cfg, b.Certs.Leaf, tel.adminHandlers(cfg.Admin), log)
	if err != nil {
		return nil, err
	}
	if th != nil && th.admin != nil && adm.Addr() != "" {
		th.admin(adm.Addr())
	}
	return adm, nil
}

// connLimits maps the [limits] section onto semantics.Limits (zero fields
// take the library defaults).
func connLimits(c config.ConnLimits) semantics.Limits { return c.SemanticsLimits() }
