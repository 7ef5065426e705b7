// Command forgeyard-loadgen runs a fleet of N real agents (the
// semantics/agent library with the synthetic executor: real mTLS,
// registration, heartbeats, leases, logs and CAS outputs) in one process
// against one forgeyard-daemon process, shows progress once a second on
// stderr and ends with a summary table (or --json). See docs/perf.md,
// "Fleet scale".
//
//	forgeyard-loadgen prepare --dir DIR --n N [--heartbeat 10s] [--listen 127.0.0.1:7443]
//	forgeyard-loadgen run --dir DIR --n N --backend quic --spawn-daemon [--kill-restart] [--graceful-restart] [--json]
//	forgeyard-loadgen run --dir DIR --n N --daemon-addr 127.0.0.1:7443 --admin-addr 127.0.0.1:9464 --daemon-pid PID
//	forgeyard-loadgen ladder --out out/scale.md [--ladder quic:1000,yamux:3000]   # what `make scale` runs
//
// prepare writes DIR/pki (the development PKI: CA, server certificate),
// N runner certificates signed by its CA (cached in DIR/pki, keyed by the
// CA and N) and DIR/daemon.toml; start a daemon on it with
//
//	forgeyard-daemon --config DIR/daemon.toml --admin-listen 127.0.0.1:9464 --matrix-driver
//
// (the loadgen offers leases through the matrix driver). With
// --spawn-daemon the loadgen starts the daemon itself (--daemon-cmd, by
// default forgeyard-daemon next to this executable or on PATH), which the
// restart scenarios need.
//
// The loadgen raises its RLIMIT_NOFILE soft limit to the hard limit; the
// daemon needs the same for large fleets (systemd: LimitNOFILE=).
//
// Exit status: 0 when every check passed, 1 when one failed (a lost or
// duplicated completion, an agent that never registered, a timeout), 2 on
// a usage error.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/tools/loadgen"
)

func main() {
	loadgen.MaybeRawServer()
	cli.Main(run)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	if soft, hard, err := raiseNoFile(); err == nil && soft < 4096 {
		fmt.Fprintf(stderr, "forgeyard-loadgen: RLIMIT_NOFILE is only %d (hard %d): large fleets will fail with EMFILE\n", soft, hard)
	}
	switch cmd {
	case "prepare":
		return prepare(args, stdout, stderr)
	case "run":
		return runCmd(ctx, args, stdout, stderr)
	case "ladder":
		return ladder(ctx, args, stdout, stderr)
	case "help":
		fmt.Fprintln(stdout, "usage: forgeyard-loadgen prepare|run|ladder [flags] (--help for each)")
		return cli.ExitOK
	}
	fmt.Fprintf(stderr, "forgeyard-loadgen: unknown command %q (prepare, run, ladder)\n", cmd)
	return cli.ExitUsage
}

// raiseNoFile sets the soft RLIMIT_NOFILE to the hard limit.
func raiseNoFile() (soft, hard uint64, err error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, 0, err
	}
	if l.Cur < l.Max {
		l.Cur = l.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
			return l.Cur, l.Max, err
		}
	}
	return l.Cur, l.Max, nil
}

func prepare(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("forgeyard-loadgen prepare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "loadgen", "work `dir`ectory")
	n := fs.Int("n", 100, "number of runner certificates")
	hb := fs.Duration("heartbeat", 10*time.Second, "heartbeat interval written into daemon.toml (0: the daemon's default)")
	quic := fs.String("listen", "127.0.0.1:7443", "QUIC listener written into daemon.toml")
	ymx := fs.String("listen-yamux", "127.0.0.1:7444", "TLS+yamux listener written into daemon.toml (empty: none)")
	wt := fs.String("listen-webtransport", "127.0.0.1:7445", "WebTransport listener written into daemon.toml (empty: none)")
	if code, ok := cli.ParseNoArgs(fs, args, stdout, stderr, "forgeyard-loadgen prepare"); !ok {
		return code
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		fmt.Fprintln(stderr, "forgeyard-loadgen:", err)
		return cli.ExitFail
	}
	p, err := loadgen.PreparePKI(filepath.Join(*dir, "pki"), *n)
	if err != nil {
		fmt.Fprintln(stderr, "forgeyard-loadgen:", err)
		return cli.ExitFail
	}
	addrs := map[string]string{"quic": *quic}
	if *ymx != "" {
		addrs["yamux"] = *ymx
	}
	if *wt != "" {
		addrs["webtransport"] = *wt
	}
	conf, err := loadgen.WriteDaemonConfig(*dir, p, *hb, addrs)
	if err != nil {
		fmt.Fprintln(stderr, "forgeyard-loadgen:", err)
		return cli.ExitFail
	}
	how := "read from the cache"
	if p.Generated {
		how = "generated"
	}
	fmt.Fprintf(stdout, "%d runner certificates %s in %v (%s)\nwrote %s; start the daemon with\n  forgeyard-daemon --config %s --admin-listen 127.0.0.1:9464 --matrix-driver\n",
		*n, how, p.Took.Round(time.Millisecond), p.CacheFile, conf, conf)
	return cli.ExitOK
}

// common are the flags of run and ladder.
type common struct {
	dir, daemonCmd, daemonArgs string
	heartbeat, steady, timeout time.Duration
	leaseRate                  float64
	sources                    int
	quiet                      bool
	profile                    time.Duration
	curves                     string
	resume                     bool
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.dir, "dir", "", "work `dir`ectory (default: a new temporary directory)")
	fs.StringVar(&c.daemonCmd, "daemon-cmd", "", "forgeyard-daemon `executable` to start (default: next to this one, then PATH)")
	fs.StringVar(&c.daemonArgs, "daemon-args", "", "extra daemon arguments, space-separated")
	fs.DurationVar(&c.heartbeat, "heartbeat", 10*time.Second, "heartbeat interval the started daemon sets for its agents")
	fs.DurationVar(&c.steady, "steady", 30*time.Second, "measuring window once every agent registered")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Minute, "bound of the whole run (per step for ladder); on expiry the summary is still printed")
	fs.Float64Var(&c.leaseRate, "lease-rate", 20, "leases offered per second across the fleet")
	fs.IntVar(&c.sources, "source-addrs", 16, "spread TCP agents (and the raw baselines) over 127.0.0.1…127.0.0.`n`")
	fs.BoolVar(&c.quiet, "quiet", false, "no progress lines")
	fs.StringVar(&c.curves, "curves", "", "comma-separated TLS key-exchange `groups` for the fleet, the started daemon ([tls] curves) and the raw herd, e.g. x25519 (default: Go's, the hybrid x25519mlkem768 first)")
	fs.BoolVar(&c.resume, "session-resumption", false, "agents keep a TLS session cache each and resume on reconnection (forgeyard-agent's default; off: every connection a full handshake, as in earlier figures)")
	fs.DurationVar(&c.profile, "profile", 0, "with a daemon the loadgen starts: record its CPU profile over the first `D` (≤ 25s) of the cold start (herd-cpu.pprof) and its heap after the steady window (steady-heap.pprof) in the work directory; 0: none")
}

func (c *common) options(stderr io.Writer) (loadgen.Options, func(), error) {
	o := loadgen.Options{Heartbeat: c.heartbeat, Steady: c.steady, Timeout: c.timeout, LeaseRate: c.leaseRate, SourceAddrs: c.sources,
		DaemonArgs: strings.Fields(c.daemonArgs), Profile: c.profile, SessionResumption: c.resume}
	if c.curves != "" {
		o.Curves = strings.Split(c.curves, ",")
	}
	if !c.quiet {
		o.Progress = stderr
	}
	cleanup := func() {}
	o.Dir = c.dir
	if o.Dir == "" {
		d, err := os.MkdirTemp("", "forgeyard-loadgen-")
		if err != nil {
			return o, cleanup, err
		}
		o.Dir, cleanup = d, func() { _ = os.RemoveAll(d) }
	}
	return o, cleanup, nil
}

func (c *common) daemonBin() (string, error) {
	if c.daemonCmd != "" {
		return c.daemonCmd, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "forgeyard-daemon")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("forgeyard-daemon")
	if err != nil {
		return "", fmt.Errorf("no forgeyard-daemon next to this executable or on PATH: build it (go build -o bin/ ./cmd/forgeyard-daemon) or pass --daemon-cmd")
	}
	return p, nil
}

func runCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("forgeyard-loadgen run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	n := fs.Int("n", 100, "number of agents")
	backend := fs.String("backend", "quic", "quic, yamux or webtransport")
	ramp := fs.Duration("ramp", 0, "start the agents evenly over this long (0: all at once)")
	spawn := fs.Bool("spawn-daemon", false, "start the daemon (needed by --kill-restart and --graceful-restart)")
	kill := fs.Bool("kill-restart", false, "after the steady window SIGKILL the daemon, restart it at once and time the fleet's return")
	graceful := fs.Bool("graceful-restart", false, "after the steady window SIGTERM the daemon (GoAway), restart it and time the fleet's return")
	raw := fs.Bool("raw", false, "measure the raw transport baseline with N connections after the fleet")
	addr := fs.String("daemon-addr", "", "the running daemon's listener for --backend (without --spawn-daemon)")
	admin := fs.String("admin-addr", "", "the running daemon's admin endpoint, started with --matrix-driver (without --spawn-daemon)")
	pid := fs.Int("daemon-pid", 0, "the running daemon's pid, for its memory and CPU (without --spawn-daemon)")
	asJSON := fs.Bool("json", false, "print the summary as JSON instead of the table")
	if code, ok := cli.ParseNoArgs(fs, args, stdout, stderr, "forgeyard-loadgen run"); !ok {
		return code
	}
	o, cleanup, err := c.options(stderr)
	if err != nil {
		fmt.Fprintln(stderr, "forgeyard-loadgen:", err)
		return cli.ExitFail
	}
	defer cleanup()
	o.Backend, o.N, o.Ramp, o.KillRestart, o.GracefulRestart, o.Raw = *backend, *n, *ramp, *kill, *graceful, *raw
	if *spawn || *kill || *graceful {
		if o.DaemonBin, err = c.daemonBin(); err != nil {
			fmt.Fprintln(stderr, "forgeyard-loadgen:", err)
			return cli.ExitUsage
		}
	} else {
		if *addr == "" || *admin == "" {
			fmt.Fprintln(stderr, "forgeyard-loadgen: give --spawn-daemon, or --daemon-addr and --admin-addr of a daemon started with --matrix-driver")
			return cli.ExitUsage
		}
		o.Attach = loadgen.Attach(map[string]string{*backend: *addr}, *admin, *pid)
	}
	s, err := loadgen.Run(ctx, o)
	if s != nil {
		if *asJSON {
			_ = s.WriteJSON(stdout)
		} else {
			_ = s.WriteTable(stdout)
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "forgeyard-loadgen:", err)
		return cli.ExitFail
	}
	if !s.OK() {
		return cli.ExitFail
	}
	return cli.ExitOK
}

func ladder(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("forgeyard-loadgen ladder", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	spec := fs.String("ladder", "", "steps backend:N[:kill+graceful+ramp=D+hold=D], comma-separated (hold: dials wait until D after a restarted daemon is ready) (default: $SCALE_LADDER, else "+loadgen.StandardLadder+")")
	out := fs.String("out", "out/scale.md", "write the markdown table to `file`")
	if code, ok := cli.ParseNoArgs(fs, args, stdout, stderr, "forgeyard-loadgen ladder"); !ok {
		return code
	}
	if *spec == "" {
		*spec = os.Getenv("SCALE_LADDER")
	}
	if *spec == "" {
		*spec = loadgen.StandardLadder
	}
	steps, err := loadgen.ParseLadder(*spec)
	if err != nil {
		fmt.Fprintln(stderr, "forgeyard-loadgen:", err)
		return cli.ExitUsage
	}
	o, cleanup, err := c.options(stderr)
	if err != nil {
		fmt.Fprintln(stderr, "forgeyard-loadgen:", err)
		return cli.ExitFail
	}
	defer cleanup()
	if o.DaemonBin, err = c.daemonBin(); err != nil {
		fmt.Fprintln(stderr, "forgeyard-loadgen:", err)
		return cli.ExitUsage
	}
	o.Raw = true
	res := loadgen.RunLadder(ctx, steps, o, stderr)
	header := fmt.Sprintf("<!-- forgeyard-loadgen ladder %q, %s, commit %s; heartbeat %v (budget: the daemon default timing.max_heartbeats_per_second = 1000/s, interval = clamp(N / 1000/s, %[4]v, timing.max_heartbeat_interval)), %.0f leases/s, steady window %v, timeout %v per step -->\n",
		*spec, time.Now().UTC().Format(time.RFC3339), commit(), c.heartbeat, c.leaseRate, c.steady, c.timeout)
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		fmt.Fprintln(stderr, "forgeyard-loadgen:", err)
		return cli.ExitFail
	}
	f, err := os.Create(*out)
	if err != nil {
		fmt.Fprintln(stderr, "forgeyard-loadgen:", err)
		return cli.ExitFail
	}
	werr := loadgen.WriteLadderMarkdown(io.MultiWriter(f, stdout), res, header)
	if err := f.Close(); err != nil || werr != nil {
		fmt.Fprintln(stderr, "forgeyard-loadgen: write", *out, err, werr)
		return cli.ExitFail
	}
	for _, r := range res {
		if r.Err != nil || r.Summary == nil || !r.Summary.OK() {
			return cli.ExitFail
		}
	}
	if len(res) < len(steps) {
		return cli.ExitFail
	}
	return cli.ExitOK
}

// commit names the source revision from the build info ("unknown" when
// not built from a VCS checkout).
func commit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}
