// Command forgeyard-agent runs a Forgeyard Transport build agent: it races
// the daemon's endpoints (QUIC first, then WebTransport, TLS+yamux and
// relays at staggered offsets; a backend wins only after a hello round
// trip; TCP endpoints go through an HTTP CONNECT proxy when one is set),
// authenticates with its runner certificate, registers, and runs
// leased attempts (semantics/agent). On connection loss it reconnects with
// exponential backoff and full jitter under the same agent session and
// resyncs its running attempts.
//
//	forgeyard-agent --config /etc/forgeyard/agent.toml
//	forgeyard-agent --dev-pki ./.dev-pki --dev-agent 1 --endpoint quic://127.0.0.1:7443
//	forgeyard-agent enroll --token fyet_... --endpoint quic://daemon:7443 --ca ca.pem --cert agent.pem --key agent-key.pem
//
// The agent renews its certificate over its session at 2/3 of its lifetime
// (the daemon must have an issuing CA) and rewrites --cert/--key atomically.
//
// This build runs attempts with the synthetic executor only: durations,
// phases and exit codes derived from the JobSpecId. It has no way to run an
// arbitrary command (§98).
//
// Observability is opt-in: --status-file PATH makes the agent rewrite PATH
// atomically every --status-interval (and on every connect and disconnect)
// with its connection health as JSON (telemetry.AgentHealth), which
//
//	forgeyard-agent connection status [--json] [--status-file PATH]
//
// reads and prints; --metrics-listen 127.0.0.1:PORT serves GET /metrics
// (Prometheus) and GET /healthz (the same JSON) on a loopback address.
//
// SIGINT or SIGTERM stops the agent: running attempts are cancelled and the
// connection closed. A protocol version mismatch with the daemon is fatal
// (exit 1) and prints the daemon's message naming both ranges.
//
// Exit status: 0 after SIGINT/SIGTERM, 1 on a fatal error, 2 on a usage or
// configuration error.
package main

import (
	"context"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"

	"forgeyard.dev/transport/internal/buildinfo"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/agentsetup"
	"forgeyard.dev/transport/internal/setup/otlpsetup"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// agentFeatures are the optional protocol features this agent offers in
// its hello (doctor offers the same, so it shows what the agent gets).
var agentFeatures = wire.Implemented

// prog is the program name in messages.
const prog = "forgeyard-agent"

// Version is reported to the daemon in TransportHelloV1 and at
// enrollment: forgeyard-agent/<module version> (internal/buildinfo).
var Version = buildinfo.Get().UserAgent(prog)

func main() {
	cli.Main(func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
		return run(ctx, args, stdout, stderr, nil)
	})
}

// testHooks let tests observe the running agent; nil in production.
type testHooks struct {
	ready   func(a *agent.Agent)
	metrics func(addr string) // --metrics-listen is serving on addr
	// sighup: the SIGHUP handler is installed; reloaded: a SIGHUP reload
	// finished (reload.go).
	sighup   func()
	reloaded func(changed bool, err error)
}

type flags struct {
	cli.RoleFlags // --config, --log-*
	cp            agentsetup.ControlPlaneFlags
	maxParallel   int
	labels        cli.StringList
	seed          uint64
	synth         agent.SyntheticOptions
	statusFile    string
	statusEvery   time.Duration
	metricsListen string
	otlpEndpoint  string
	proxy         string
	protocol      string
	noProxy       string
}

func newFlagSet(f *flags, out io.Writer) *flag.FlagSet {
	fs := cli.NewRoleFlagSet("forgeyard-agent", out, &f.RoleFlags, true)
	fs.Var((*cli.StringList)(&f.cp.Endpoints), "endpoint", "daemon endpoint `URI`, repeatable, raced in order by class (QUIC at 0, WebTransport +250ms, TLS+yamux +500ms, relays +1s): quic://host:7443, webtransport://host:443, yamux://host:7444, yamux+upgrade://host:443, relay+yamux://relay:443 (key: control_plane.endpoints; replaces the file's list)")
	fs.StringVar(&f.proxy, "proxy", "", "HTTP CONNECT proxy `URL` http://[user:pass@]host:port for the TCP endpoints (yamux, yamux+upgrade, relays), or \"none\" (key: control_plane.proxy; default: HTTPS_PROXY/NO_PROXY from the environment)")
	fs.StringVar(&f.noProxy, "no-proxy", "", "`hosts` reached without --proxy, NO_PROXY syntax (key: control_plane.no_proxy)")
	fs.StringVar(&f.cp.ServerName, "server-name", "", "`name` checked against the daemon certificate (key: control_plane.server_name; default: the endpoint host)")
	fs.StringVar(&f.cp.Cert, "cert", "", "agent certificate PEM `file`, bound to the RunnerId (key: control_plane.credential.certificate)")
	fs.StringVar(&f.cp.Key, "key", "", "agent private key PEM `file` (key: control_plane.credential.private_key)")
	fs.StringVar(&f.cp.CA, "ca", "", "CA PEM `file` that signs the daemon certificate (key: control_plane.credential.ca)")
	fs.StringVar(&f.cp.DevPKI, "dev-pki", "", "DEVELOPMENT ONLY: create/reuse a dev PKI in `dir` and use agent --dev-agent's certificate")
	fs.StringVar(&f.cp.DevAgent, "dev-agent", "1", "agent `name` inside --dev-pki")
	fs.IntVar(&f.maxParallel, "max-parallel", 0, "attempts run at once (key: max_parallel; default 1)")
	fs.Var(&f.labels, "label", "capability `label`, repeatable (key: capabilities.labels; replaces the file's list)")
	fs.StringVar(&f.statusFile, "status-file", "", "rewrite `file` atomically with the connection health as JSON, read by `forgeyard-agent connection status` (e.g. "+DefaultStatusFile+")")
	fs.DurationVar(&f.statusEvery, "status-interval", DefaultStatusInterval, "how often --status-file is rewritten (also on every connect and disconnect)")
	fs.StringVar(&f.otlpEndpoint, "otlp-endpoint", "", "export traces over OTLP to the collector at `URL`, e.g. http://127.0.0.1:4318 (key: telemetry.otlp_endpoint; default: OTEL_EXPORTER_OTLP_ENDPOINT, else off)")
	fs.StringVar(&f.metricsListen, "metrics-listen", "", "serve /metrics and /healthz on loopback `host:port` (a missing host means 127.0.0.1)")
	fs.DurationVar(&f.synth.MinDuration, "synthetic-duration", 0, "DEVELOPMENT ONLY: each synthetic attempt runs for `d` (default 1–10ms, derived from the JobSpecId)")
	fs.IntVar(&f.synth.LogLines, "synthetic-log-lines", 0, "DEVELOPMENT ONLY: log lines each synthetic attempt writes (default 4; -1 none)")
	fs.DurationVar(&f.synth.LogInterval, "synthetic-log-interval", 0, "DEVELOPMENT ONLY: pause `d` after each synthetic log line")
	fs.IntVar(&f.synth.OutputSize, "synthetic-output-size", 0, "DEVELOPMENT ONLY: `bytes` of each synthetic attempt's one output (default 256; -1 none)")
	fs.StringVar(&f.protocol, "protocol", "", "TESTING ONLY: protocol `range` MIN-MAX to advertise, e.g. 2.0-2.0 (default: all this build supports)")
	fs.Uint64Var(&f.seed, "synthetic-seed", 1, "`seed` of the synthetic executor (durations and exit codes derive from it and the JobSpecId)")
	cli.SetUsage(fs, `Usage: forgeyard-agent [--config FILE] [flags]
       forgeyard-agent connection status [--json] [--status-file FILE]
       forgeyard-agent doctor [--config FILE] [flags] [--json]
       forgeyard-agent enroll --token TOKEN --endpoint URI --cert FILE --key FILE [flags]
       forgeyard-agent --version | version [--json] | completion bash|zsh|fish | man

Runs a Forgeyard Transport agent with the synthetic executor. Settings come
from the TOML file given with --config; each flag below overrides one key of
it. Credentials are always file paths. SIGINT/SIGTERM stop the agent.

Flags:
`, `
Examples:
  forgeyard-agent --config /etc/forgeyard/agent.toml
  forgeyard-agent --dev-pki ./.dev-pki --dev-agent 1 --endpoint quic://127.0.0.1:7443
  forgeyard-agent --config /etc/forgeyard/agent.toml --status-file `+DefaultStatusFile+` --metrics-listen 127.0.0.1:9465
  forgeyard-agent connection status --status-file `+DefaultStatusFile+`
`)
	return fs
}

// newRoot is the command tree: the agent itself (the root's flags) and its
// subcommands, for dispatch, completions and the man page.
func newRoot(ctx context.Context) *cli.Command {
	return cli.RoleRoot(prog, "run a Forgeyard Transport build agent",
		func() *flag.FlagSet { return newFlagSet(new(flags), io.Discard) },
		&cli.Command{Name: "doctor", Summary: "check the configuration, endpoints, certificates and protocol, and say what to fix",
			Synopsis: "[--config FILE] [flags] [--json]",
			Run:      func(args []string, stdout, stderr io.Writer) int { return runDoctor(ctx, args, stdout, stderr) },
			Flags:    func() *flag.FlagSet { fs, _, _, _ := doctorFlagSet(new(flags), io.Discard); return fs }},
		&cli.Command{Name: "enroll", Summary: "exchange a one-time enrollment token for a runner certificate",
			Synopsis: "--token TOKEN --endpoint URI --cert FILE --key FILE [flags]",
			Run:      func(args []string, stdout, stderr io.Writer) int { return runEnroll(ctx, args, stdout, stderr) },
			Flags:    func() *flag.FlagSet { return enrollFlagSet(new(enrollOpts), io.Discard) }},
		&cli.Command{Name: "connection", Summary: "the running agent's connection", Sub: []*cli.Command{
			{Name: "status", Summary: "print the connection health the running agent writes to its --status-file",
				Synopsis: "[--json] [--status-file FILE]",
				Run: func(args []string, stdout, stderr io.Writer) int {
					return runConnectionStatus(args, stdout, stderr, time.Now())
				},
				Flags: func() *flag.FlagSet { fs, _, _, _ := connectionStatusFlagSet(io.Discard); return fs }},
		}})
}

// run is main without the process; tests call it in-process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, th *testHooks) int {
	if len(args) > 0 && args[0] == "connection" && (len(args) < 2 || args[1] != "status") {
		fmt.Fprintln(stderr, "forgeyard-agent: usage: forgeyard-agent connection status [--json] [--status-file FILE]")
		return cli.ExitUsage
	}
	var f flags
	fs := newFlagSet(&f, stderr)
	if code, ok := cli.ParseRoot(newRoot(ctx), fs, args, stdout, stderr); !ok {
		return code
	}
	if f.synth.MinDuration < 0 || f.synth.MinDuration > time.Hour || f.synth.LogLines > 100000 || f.synth.LogInterval < 0 || f.synth.LogInterval > time.Minute {
		fmt.Fprintln(stderr, "forgeyard-agent: --synthetic-duration must be 0–1h, --synthetic-log-lines at most 100000, --synthetic-log-interval 0–1m")
		return cli.ExitUsage
	}
	f.synth.MaxDuration = f.synth.MinDuration
	if f.synth.OutputSize < -1 || f.synth.OutputSize > 1<<30 {
		fmt.Fprintln(stderr, "forgeyard-agent: --synthetic-output-size must be -1–1GiB")
		return cli.ExitUsage
	}
	var protocol wire.ProtocolRange
	if f.protocol != "" {
		var err error
		if protocol, err = wire.ParseRange(f.protocol); err != nil {
			fmt.Fprintf(stderr, "forgeyard-agent: --protocol: %v\n", err)
			return cli.ExitUsage
		}
	}
	if f.statusEvery < 100*time.Millisecond || f.statusEvery > time.Hour {
		fmt.Fprintln(stderr, "forgeyard-agent: --status-interval must be 100ms–1h")
		return cli.ExitUsage
	}
	metricsAddr, err := config.AdminAddr("--metrics-listen", f.metricsListen, false)
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard-agent: %v\n", err)
		return cli.ExitUsage
	}
	cfg, err := buildConfig(fs, &f)
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard-agent: %v\n", err)
		return cli.ExitUsage
	}
	log := cfg.Log.NewLogger(stderr)
	tel := newAgentTelemetry(f.statusFile, f.statusEvery, metricsAddr != "", log)
	// The runner certificate is renewed in place: read at every scrape.
	tel.m.WatchCertificate("client", telemetry.CertificateFile(cfg.ControlPlane.Credential.Certificate))
	if ca := telemetry.CertificateFile(cfg.ControlPlane.Credential.CA)(); ca != nil { // read at start only
		tel.m.WatchCertificate("ca", func() *x509.Certificate { return ca })
	}
	tracing, export, err := otlpsetup.TracingEnv(ctx, cfg.Telemetry, "forgeyard-agent", os.Getenv)
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard-agent: %v\n", err)
		return cli.ExitUsage
	}
	if export.Endpoint != "" {
		log.Info("trace export", "endpoint", export.Endpoint, "protocol", export.Protocol, "from", export.Source, "sampler", export.Sampler)
	}
	defer otlpsetup.Flush(tracing) // the last spans (bounded: the collector may be gone)
	a, err := newAgent(cfg, f.seed, f.synth, protocol, log, tel.hooks(), tel.m, tracing)
	if err != nil {
		return agentsetup.StartFailed(stderr, prog, err, "; `forgeyard-agent doctor` shows the details")
	}
	defer a.Close()
	telCtx, stopTel := context.WithCancel(context.Background())
	telDone := make(chan struct{})
	go func() { defer close(telDone); tel.run(telCtx, a) }()
	defer func() { stopTel(); <-telDone }() // the final status file says "agent stopped"
	expiryDone := make(chan struct{})
	go func() { defer close(expiryDone); watchCertExpiry(telCtx, log, cfg.ControlPlane.Credential.Certificate) }()
	defer func() { stopTel(); <-expiryDone }()
	if metricsAddr != "" {
		ln, err := net.Listen("tcp", metricsAddr)
		if err != nil {
			fmt.Fprintf(stderr, "forgeyard-agent: --metrics-listen: %v\n", err)
			return cli.ExitFail
		}
		adm := cli.ServeAdmin(ln, "", tel.handler(), log)
		defer adm.Stop(2 * time.Second)
		log.Info("metrics endpoint listening", "addr", adm.Addr(), "paths", "/metrics /healthz")
		if th != nil && th.metrics != nil {
			th.metrics(adm.Addr())
		}
	}
	var sighup func()
	var reloaded func(bool, error)
	if th != nil {
		sighup, reloaded = th.sighup, th.reloaded
	}
	reloadDone := make(chan struct{})
	go func() {
		defer close(reloadDone)
		reloadOnSIGHUP(telCtx, fs, &f, cfg.MaxParallel, a, log, sighup, reloaded) // reload.go
	}()
	defer func() { stopTel(); <-reloadDone }()
	log.Info("agent starting", "session", a.Session(), "endpoints", cfg.ControlPlane.Endpoints, "max_parallel", cfg.MaxParallel)
	if th != nil && th.ready != nil {
		th.ready(a)
	}
	return agentsetup.Run(ctx, a, log, stderr, prog, "agent")
}

func buildConfig(fs *flag.FlagSet, f *flags) (*config.Agent, error) {
	cfg, err := cli.LoadConfig(fs, f.ConfigFile, config.ReadAgent, func(cfg *config.Agent, set config.SetFlags) error {
		str := set.String
		if err := f.cp.Apply(&cfg.ControlPlane, set); err != nil {
			return err
		}
		str("proxy", &cfg.ControlPlane.Proxy, f.proxy)
		str("no-proxy", &cfg.ControlPlane.NoProxy, f.noProxy)
		if set["max-parallel"] {
			cfg.MaxParallel = f.maxParallel
		}
		if set["label"] {
			cfg.Capabilities.Labels = f.labels
		}
		f.ApplyLog(&cfg.Log, set)
		str("otlp-endpoint", &cfg.Telemetry.OTLPEndpoint, f.otlpEndpoint)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return cfg, nil
}

// newAgent builds the agent from its configuration (agentsetup.Build:
// keepalive, credential, one dialer per endpoint, the file's settings)
// with the synthetic executor and this binary's telemetry.
func newAgent(cfg *config.Agent, seed uint64, synth agent.SyntheticOptions, protocol wire.ProtocolRange, log *slog.Logger, hooks agent.Hooks, m *telemetry.Metrics, tr *telemetry.Tracing) (*agent.Agent, error) {
	// The expiry warning (§22) is logged at start and then periodically by
	// watchCertExpiry (expiry.go).
	ac, err := agentsetup.Build(cfg, log)
	if err != nil {
		return nil, err
	}
	ac.Role = agentwire.RoleAgent
	ac.Executor = agent.NewSyntheticExecutor(seed, synth)
	ac.Protocol = protocol
	ac.Version, ac.Hooks, ac.Metrics, ac.Tracing = Version, hooks, m, tr
	ac.Features = agentFeatures // the daemon's trace continues here and back (§211)
	return agent.New(ac)
}
