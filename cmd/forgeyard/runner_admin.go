package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"forgeyard.dev/transport/internal/adminapi"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/semantics/telemetry/tablecell"
)

// The runner inventory and admin commands over the daemon's authenticated
// admin endpoint (internal/adminapi/runners.go): `forgeyard runner
// list|show|drain|resume|refresh-capabilities|probe`.

const runnerListHelp = `Lists the runners the daemon's authority knows (GET /runners): OS/arch, labels,
slots, where each is connected (daemon, backend, protocol, agent version),
its last heartbeat, health and drain state.`

const runnerShowHelp = `Shows one runner of the inventory (GET /runners/RUNNER): capabilities,
connection, last heartbeat, health checks and drain state.`

const runnerDrainHelp = `Drains RUNNER (POST /runners/RUNNER/drain): no daemon sharing the authority
offers it new leases; running attempts finish. The agent is told now if it is
connected to this daemon, else when it reconnects. Audited.`

const runnerResumeHelp = `Ends a drain of RUNNER (POST /runners/RUNNER/resume). Audited.`

const runnerRefreshHelp = `Asks RUNNER's agent for its current capabilities and records them
(POST /runners/RUNNER/refresh-capabilities). The runner must be connected to
this daemon. Audited.`

const runnerProbeHelp = `Runs one of the agent's built-in health probes on RUNNER and records the
result as its health (POST /runners/RUNNER/probe): connectivity, disk, clock
or full (default). Never a program: the probes are fixed (§98). The runner
must be connected to this daemon. Audited. Exit status 1 when Unhealthy.`

// parseRunnerAdmin parses `forgeyard runner NAME [RUNNER] [flags]`
// (flags before or after RUNNER); want is the number of positional
// arguments (0 or 1). extra registers the command's own flags.
func parseRunnerAdmin(name, help string, args []string, want int, extra func(*flag.FlagSet), stdout, stderr io.Writer) (*adminapi.Client, *adminFlags, string, int) {
	prog := "forgeyard runner " + name
	var f adminFlags
	fs := newAdminFlagSet(name, help, &f, stderr)
	if extra != nil {
		extra(fs)
	}
	usage := "Usage: " + prog + " [--admin URL] [--token-file FILE] [--json]"
	if want == 1 {
		usage = "Usage: " + prog + " RUNNER [--admin URL] [--token-file FILE] [--json]"
	}
	cli.SetUsage(fs, usage+"\n\n"+help+"\n\nFlags:\n", "")
	if code, ok := cli.Parse(fs, args, stdout); !ok {
		return nil, nil, "", code
	}
	var runner string
	if want == 1 && fs.NArg() > 0 {
		runner = fs.Arg(0)
		if code, ok := cli.Parse(fs, fs.Args()[1:], stdout); !ok {
			return nil, nil, "", code
		}
	}
	switch {
	case want == 1 && runner == "":
		fmt.Fprintf(stderr, "%s: missing RUNNER (see forgeyard runner list)\n", prog)
		return nil, nil, "", cli.ExitUsage
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n", prog, fs.Arg(0))
		return nil, nil, "", cli.ExitUsage
	}
	c, code := adminClient(prog, &f, stderr)
	return c, &f, runner, code
}

func runRunnerList(args []string, stdout, stderr io.Writer) int {
	c, f, _, code := parseRunnerAdmin("list", runnerListHelp, args, 0, nil, stdout, stderr)
	if c == nil {
		return code
	}
	return adminShow(c, f, "forgeyard runner list", adminapi.PathRunners, stdout, stderr,
		func(w io.Writer, rs *[]adminapi.Runner) { writeRunners(w, *rs, time.Now()) }, nil)
}

// ago is how long before now t was ("1.2s ago"), or "never" for the zero
// time: the last heartbeat of runner list and transport sessions.
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return now.Sub(t).Round(100*time.Millisecond).String() + " ago"
}

func connState(r *adminapi.Runner) string {
	switch {
	case r.Connected && r.Local:
		return "connected here"
	case r.Connected:
		return "connected to " + r.Daemon
	case r.Daemon != "":
		return "disconnected (last on " + r.Daemon + ")"
	}
	return "never connected"
}

func writeRunners(w io.Writer, rs []adminapi.Runner, now time.Time) {
	if len(rs) == 0 {
		fmt.Fprintln(w, "no runners known")
		return
	}
	tw := newTable(w, "RUNNER", "OS/ARCH", "LABELS", "SLOTS", "CONNECTION", "BACKEND", "PROTOCOL", "LAST HEARTBEAT", "HEALTH", "DRAINED", "AGENT")
	for _, r := range rs {
		drained := "no"
		if r.Drained {
			drained = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Runner, tablecell.Dash(r.Capabilities.OS), tablecell.Dash(r.Capabilities.Arch),
			tablecell.Dash(strings.Join(r.Capabilities.Labels, ",")), r.Capabilities.MaxParallel, connState(&r), tablecell.Dash(r.Backend),
			tablecell.Dash(r.Protocol), ago(r.LastHeartbeat, now), tablecell.Dash(r.Health.Status), drained, tablecell.Dash(r.AgentVersion))
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%d runners\n", len(rs))
}

func runnerPath(runner string, cmd ...string) string {
	p := adminapi.PathRunners + "/" + url.PathEscape(runner)
	for _, c := range cmd {
		p += "/" + c
	}
	return p
}

func runRunnerShow(args []string, stdout, stderr io.Writer) int {
	c, f, runner, code := parseRunnerAdmin("show", runnerShowHelp, args, 1, nil, stdout, stderr)
	if c == nil {
		return code
	}
	return adminShow(c, f, "forgeyard runner show", runnerPath(runner), stdout, stderr,
		func(w io.Writer, r *adminapi.Runner) { writeRunner(w, r, time.Now()) }, nil)
}

func writeRunner(w io.Writer, r *adminapi.Runner, now time.Time) {
	tw := newTable(w)
	cp := &r.Capabilities
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("runner", r.Runner)
	row("os/arch", tablecell.Dash(cp.OS)+"/"+tablecell.Dash(cp.Arch))
	row("labels", tablecell.Dash(strings.Join(cp.Labels, ", ")))
	row("tools", tablecell.Dash(strings.Join(cp.Tools, ", ")))
	row("slots", fmt.Sprint(cp.MaxParallel))
	row("resources", fmt.Sprintf("%d millicores, %d MiB memory, %d MiB disk", cp.CPUMillis, cp.MemBytes>>20, cp.DiskBytes>>20))
	row("capabilities updated", ago(cp.Updated, now))
	row("connection", connState(r))
	row("backend", tablecell.Dash(r.Backend))
	row("protocol", tablecell.Dash(r.Protocol))
	row("agent version", tablecell.Dash(r.AgentVersion))
	row("role", tablecell.Dash(r.Role))
	row("last heartbeat", ago(r.LastHeartbeat, now))
	drain := "no"
	if r.Drained {
		drain = "yes: " + tablecell.Dash(r.DrainReason)
	}
	row("drained", drain)
	h := "never reported"
	if r.Health.Status != "" {
		h = r.Health.Status + " (" + ago(r.Health.ReportedAt, now)
		if r.Health.Probe != "" {
			h += ", probe " + r.Health.Probe
		}
		h += ")"
	}
	row("health", h)
	for _, c := range r.Health.Checks {
		row("  "+c.Name, c.Status+"  "+c.Message)
	}
	tw.Flush()
}

func runnerCommandRun(name, help string, args []string, extra func(*flag.FlagSet), body func() adminapi.RunnerCommand, stdout, stderr io.Writer) int {
	c, f, runner, code := parseRunnerAdmin(name, help, args, 1, extra, stdout, stderr)
	if c == nil {
		return code
	}
	defer c.Close()
	var res adminapi.CommandResult
	if err := c.Post(context.Background(), runnerPath(runner, name), body(), &res); err != nil {
		fmt.Fprintf(stderr, "forgeyard runner %s: %v\n", name, err)
		return cli.ExitFail
	}
	if f.asJSON {
		printJSON(stdout, &res)
	} else {
		writeCommandResult(stdout, &res)
	}
	if res.Health != nil && res.Health.Status == "Unhealthy" {
		return cli.ExitFail
	}
	return cli.ExitOK
}

func writeCommandResult(w io.Writer, res *adminapi.CommandResult) {
	state := "done"
	if !res.Delivered {
		state = "recorded"
	}
	fmt.Fprintf(w, "%s %s: %s\n", res.Command, res.Runner, state)
	if res.Message != "" {
		fmt.Fprintln(w, res.Message)
	}
	if c := res.Capabilities; c != nil {
		fmt.Fprintf(w, "capabilities: %s/%s, labels %s, %d slots\n", c.OS, c.Arch, tablecell.Dash(strings.Join(c.Labels, ",")), c.MaxParallel)
	}
	if h := res.Health; h != nil {
		fmt.Fprintf(w, "health: %s (probe %s, %d ms)\n", h.Status, h.Probe, res.DurationMs)
		for _, c := range h.Checks {
			fmt.Fprintf(w, "  %-14s %-9s %s\n", c.Name, c.Status, c.Message)
		}
	}
}

// adminCommandFlags is the flag set of `forgeyard runner NAME` for the
// command tree (completions, man page): the admin flags and extra's.
func adminCommandFlags(name, help string, extra func(*flag.FlagSet)) func() *flag.FlagSet {
	return func() *flag.FlagSet {
		var f adminFlags
		fs := newAdminFlagSet(name, help, &f, io.Discard)
		if extra != nil {
			extra(fs)
		}
		return fs
	}
}

// drainFlags registers drain's --reason into reason.
func drainFlags(reason *string) func(*flag.FlagSet) {
	return func(fs *flag.FlagSet) {
		fs.StringVar(reason, "reason", "", "operator `text` shown by the agent (≤ 256 bytes)")
	}
}

// probeFlags registers probe's --probe into probe.
func probeFlags(probe *string) func(*flag.FlagSet) {
	return func(fs *flag.FlagSet) {
		fs.StringVar(probe, "probe", "full", "probe `kind`: "+strings.Join(adminapi.ProbeKinds, ", "))
	}
}

func runRunnerDrain(args []string, stdout, stderr io.Writer) int {
	var reason string
	return runnerCommandRun(adminapi.CommandDrain, runnerDrainHelp, args, drainFlags(&reason),
		func() adminapi.RunnerCommand { return adminapi.RunnerCommand{Reason: reason} }, stdout, stderr)
}

func runRunnerResume(args []string, stdout, stderr io.Writer) int {
	return runnerCommandRun(adminapi.CommandResume, runnerResumeHelp, args, nil,
		func() adminapi.RunnerCommand { return adminapi.RunnerCommand{} }, stdout, stderr)
}

func runRunnerRefresh(args []string, stdout, stderr io.Writer) int {
	return runnerCommandRun(adminapi.CommandRefresh, runnerRefreshHelp, args, nil,
		func() adminapi.RunnerCommand { return adminapi.RunnerCommand{} }, stdout, stderr)
}

func runRunnerProbe(args []string, stdout, stderr io.Writer) int {
	var probe string
	return runnerCommandRun(adminapi.CommandProbe, runnerProbeHelp, args, probeFlags(&probe),
		func() adminapi.RunnerCommand { return adminapi.RunnerCommand{Probe: probe} }, stdout, stderr)
}
