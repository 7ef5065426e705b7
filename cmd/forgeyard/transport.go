package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"text/tabwriter"
	"time"

	"forgeyard.dev/transport/semantics/telemetry/tablecell"

	"forgeyard.dev/transport/internal/adminapi"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/doctor"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/trust"
)

// DefaultAdmin is the admin endpoint `forgeyard transport` talks to when
// --admin and FORGEYARD_ADMIN are not set.
const DefaultAdmin = "http://127.0.0.1:9464"

// AdminEnv names the environment variable holding the default --admin.
const AdminEnv = "FORGEYARD_ADMIN"

// transportCommands are the `forgeyard transport` subcommands.
func transportCommands() []*cli.Command {
	leaf := func(name, summary, help string, run func([]string, io.Writer, io.Writer) int) *cli.Command {
		return &cli.Command{Name: name, Summary: summary, Run: run, Synopsis: "[--admin URL] [--token-file FILE] [--json]",
			Flags: func() *flag.FlagSet { return newAdminFlagSet(name, help, new(adminFlags), io.Discard) }}
	}
	return []*cli.Command{
		leaf("status", "daemon transport status: listeners, certificate, connections, authority", statusHelp, runTransportStatus),
		leaf("sessions", "connected agents: runner, backend, protocol, last heartbeat", sessionsHelp, runTransportSessions),
		leaf("protocols", "protocol versions and features: supported, configured, in use", protocolsHelp, runTransportProtocols),
		leaf("doctor", "check the daemon side and say what to fix", doctorHelp, runTransportDoctor),
	}
}

// adminFlags are the flags every transport subcommand takes.
type adminFlags struct {
	admin     string
	tokenFile string
	asJSON    bool
	timeout   time.Duration
}

func newAdminFlagSet(name, help string, f *adminFlags, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("forgeyard transport "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := os.Getenv(AdminEnv)
	if def == "" {
		def = DefaultAdmin
	}
	fs.StringVar(&f.admin, "admin", def, "daemon admin endpoint: http://HOST:PORT (its --admin-listen) or unix:///PATH (its --admin-socket); default $"+AdminEnv+" or "+DefaultAdmin)
	fs.StringVar(&f.tokenFile, "token-file", "", "`file` with the admin bearer token (the daemon's admin.token_file); default $"+adminapi.TokenEnv)
	fs.BoolVar(&f.asJSON, "json", false, "print JSON instead of a table")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "how long to wait for the daemon")
	cli.SetUsage(fs, "Usage: forgeyard transport "+name+" [--admin URL] [--token-file FILE] [--json]\n\n"+help+"\n\nFlags:\n", "")
	return fs
}

// parseAdmin parses args and returns a client, or an exit code.
func parseAdmin(name, help string, args []string, stdout, stderr io.Writer) (*adminapi.Client, *adminFlags, int) {
	var f adminFlags
	fs := newAdminFlagSet(name, help, &f, stderr)
	if code, ok := cli.ParseNoArgs(fs, args, stdout, stderr, "forgeyard transport "+name); !ok {
		return nil, nil, code
	}
	c, code := adminClient("forgeyard transport "+name, &f, stderr)
	return c, &f, code
}

// adminClient checks f (parsed) and returns its client, or nil and an exit
// code; prog names the command in messages.
func adminClient(prog string, f *adminFlags, stderr io.Writer) (*adminapi.Client, int) {
	name := prog
	if f.timeout <= 0 || f.timeout > 10*time.Minute {
		fmt.Fprintf(stderr, "%s: --timeout must be between 0 and 10m\n", name)
		return nil, cli.ExitUsage
	}
	token, src := "", ""
	switch {
	case f.tokenFile != "":
		t, err := adminapi.ReadTokenFile(f.tokenFile)
		if err != nil {
			fmt.Fprintf(stderr, "%s: --token-file: %v\n", name, err)
			return nil, cli.ExitUsage
		}
		token, src = t, "the token in "+f.tokenFile
	case os.Getenv(adminapi.TokenEnv) != "":
		token, src = strings.TrimSpace(os.Getenv(adminapi.TokenEnv)), "the token in $"+adminapi.TokenEnv
	}
	c, err := adminapi.NewClient(f.admin, token, src, f.timeout)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return nil, cli.ExitUsage
	}
	return c, -1
}

func printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// newTable is the command's table on w (columns two spaces apart), its
// header row, the columns joined by tabs, written when given.
func newTable(w io.Writer, header ...string) *tabwriter.Writer {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(header) > 0 {
		fmt.Fprintln(tw, strings.Join(header, "\t"))
	}
	return tw
}

// adminShow is the rest of a read-only admin subcommand once parsed: GET
// path into a T, then print it as JSON (--json; a nil list prints as []) or
// with text, and return exit's status for it (nil exit: ExitOK). prog names
// the command in messages. It closes c.
func adminShow[T any](c *adminapi.Client, f *adminFlags, prog, path string, stdout, stderr io.Writer, text func(w io.Writer, v *T), exit func(v *T) int) int {
	defer c.Close()
	var v T
	if err := c.Get(context.Background(), path, &v); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return cli.ExitFail
	}
	if f.asJSON {
		if rv := reflect.ValueOf(&v).Elem(); rv.Kind() == reflect.Slice && rv.IsNil() {
			rv.Set(reflect.MakeSlice(rv.Type(), 0, 0))
		}
		printJSON(stdout, &v)
	} else {
		text(stdout, &v)
	}
	if exit == nil {
		return cli.ExitOK
	}
	return exit(&v)
}

const statusHelp = `Prints the daemon's transport status from its admin endpoint (GET /status):
listeners with backend, address and state; the server certificate's validity
and days to expiry; connections by backend; refused handshakes; the authority
backend and whether it answers; whether the daemon is draining.
Exit status 0 when ok or degraded, 1 when down or unreachable.`

func runTransportStatus(args []string, stdout, stderr io.Writer) int {
	c, f, code := parseAdmin("status", statusHelp, args, stdout, stderr)
	if c == nil {
		return code
	}
	return adminShow(c, f, "forgeyard transport status", adminapi.PathStatus, stdout, stderr,
		func(w io.Writer, st *adminapi.Status) { writeStatus(w, st, time.Now()) },
		func(st *adminapi.Status) int {
			if st.Status == telemetry.StatusDown {
				return cli.ExitFail
			}
			return cli.ExitOK
		})
}

// daemonName is how status shows the daemon: its id, else its host (and
// how to name it), else that it is unnamed.
func daemonName(st *adminapi.Status) string {
	switch {
	case st.Daemon != "":
		return st.Daemon
	case st.Host != "":
		return st.Host + " (no id configured: set key id)"
	}
	return "unnamed (no id configured: set key id)"
}

func writeStatus(w io.Writer, st *adminapi.Status, now time.Time) {
	tw := newTable(w)
	fmt.Fprintf(tw, "DAEMON\t%s\n", daemonName(st))
	if st.Version != "" {
		fmt.Fprintf(tw, "VERSION\t%s\n", st.Version)
	}
	fmt.Fprintf(tw, "STATUS\t%s\n", st.Status)
	for _, p := range st.Problems {
		fmt.Fprintf(tw, "PROBLEM\t%s\n", p)
	}
	fmt.Fprintf(tw, "STARTED\t%s (up %s)\n", st.StartedAt.UTC().Format(time.RFC3339), now.Sub(st.StartedAt).Round(time.Second))
	fmt.Fprintf(tw, "DRAINING\t%s\n", tablecell.YesNo(st.Draining))
	fmt.Fprintf(tw, "CONNECTIONS\t%d%s\n", st.Connections, tablecell.ByBackend(st.ConnectionsByBackend))
	fmt.Fprintf(tw, "SESSIONS\t%d\n", st.Sessions)
	fmt.Fprintf(tw, "HANDSHAKE FAILURES\t%d\n", st.HandshakeFailures)
	fmt.Fprintf(tw, "REGISTER FAILURES\t%d\n", st.RegistrationFailures)
	if c := st.Certificate; c != nil {
		valid := "valid"
		if !c.Valid {
			valid = "NOT VALID"
		}
		fmt.Fprintf(tw, "CERTIFICATE\t%s, %s %s → %s, %d days to expiry\n", c.Subject, valid,
			c.NotBefore.Format("2006-01-02"), c.NotAfter.Format("2006-01-02"), c.DaysToExpiry)
	} else {
		fmt.Fprintf(tw, "CERTIFICATE\tnone\n")
	}
	a := st.Authority
	if a.Reachable {
		fmt.Fprintf(tw, "AUTHORITY\t%s, reachable (%.1f ms)\n", a.Backend, a.LatencyMs)
	} else {
		fmt.Fprintf(tw, "AUTHORITY\t%s, UNREACHABLE: %s\n", a.Backend, a.Error)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = newTable(w, "LISTENER", "BACKEND", "STATE", "ERROR")
	for _, l := range st.Listeners {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", l.Address, l.Backend, l.State, tablecell.Dash(l.Error))
	}
	tw.Flush()
}

const sessionsHelp = `Lists the agents connected to the daemon (GET /sessions), oldest connection
first: runner, backend, negotiated protocol, remote address, state, epoch,
age of the last heartbeat and the agent version. A fenced transport (replaced
by a newer registration of the same agent session) is marked "fenced".`

func runTransportSessions(args []string, stdout, stderr io.Writer) int {
	c, f, code := parseAdmin("sessions", sessionsHelp, args, stdout, stderr)
	if c == nil {
		return code
	}
	return adminShow(c, f, "forgeyard transport sessions", adminapi.PathSessions, stdout, stderr,
		func(w io.Writer, ss *[]adminapi.Session) { writeSessions(w, *ss, time.Now()) }, nil)
}

func writeSessions(w io.Writer, ss []adminapi.Session, now time.Time) {
	if len(ss) == 0 {
		fmt.Fprintln(w, "no agents connected")
		return
	}
	tw := newTable(w, "RUNNER", "BACKEND", "PROTOCOL", "REMOTE", "STATE", "EPOCH", "LAST HEARTBEAT", "CONNECTED", "AGENT")
	for _, s := range ss {
		state := s.State
		if s.Fenced {
			state += " (fenced)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", s.Runner, s.Backend, s.Protocol, s.Remote, state, s.Epoch, ago(s.LastHeartbeat, now),
			now.Sub(s.ConnectedAt).Round(time.Second).String()+" ago", tablecell.Dash(s.AgentVersion))
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%d transports\n", len(ss))
}

const protocolsHelp = `Shows the protocol policy of the daemon (GET /protocols): the versions this
build supports, the configured range (protocol_min..protocol_max), the
minimum protocol policy (the downgrade floor, §274), the optional features it
offers, and how many connected agents use each version.`

func runTransportProtocols(args []string, stdout, stderr io.Writer) int {
	c, f, code := parseAdmin("protocols", protocolsHelp, args, stdout, stderr)
	if c == nil {
		return code
	}
	return adminShow(c, f, "forgeyard transport protocols", adminapi.PathProtocols, stdout, stderr, writeProtocols, nil)
}

// writeProtocols prints GET /protocols as two tables.
func writeProtocols(w io.Writer, p *adminapi.Protocols) {
	tw := newTable(w)
	fmt.Fprintf(tw, "SUPPORTED\t%s–%s\n", p.Supported.Min, p.Supported.Max)
	fmt.Fprintf(tw, "CONFIGURED\t%s–%s\n", p.Configured.Min, p.Configured.Max)
	fmt.Fprintf(tw, "MIN PROTOCOL\t%s\n", p.MinProtocol)
	feats := "none"
	if len(p.Features) > 0 {
		feats = strings.Join(p.Features, ", ")
	}
	fmt.Fprintf(tw, "FEATURES\t%s\n", feats)
	tw.Flush()
	fmt.Fprintln(w)
	tw = newTable(w, "PROTOCOL", "AGENTS")
	for _, v := range p.Agents {
		fmt.Fprintf(tw, "%s\t%d\n", v.Protocol, v.Agents)
	}
	if len(p.Agents) == 0 {
		fmt.Fprintf(tw, "-\t0\n")
	}
	tw.Flush()
}

const doctorHelp = `Checks the daemon side of the transport through its admin endpoint and says
in plain words what to fix: the admin endpoint answers, every listener is up,
the server certificate is valid and not about to expire, the authority
answers, the daemon is not draining, agents are connected, and handshakes are
not being refused. Exit status 1 when a check FAILs.`

func runTransportDoctor(args []string, stdout, stderr io.Writer) int {
	c, f, code := parseAdmin("doctor", doctorHelp, args, stdout, stderr)
	if c == nil {
		return code
	}
	defer c.Close()
	r := daemonDoctor(context.Background(), c, time.Now())
	_ = r.Print(stdout, f.asJSON)
	if r.Failed() {
		return cli.ExitFail
	}
	return cli.ExitOK
}

// daemonDoctor runs the daemon-side checks.
func daemonDoctor(ctx context.Context, c *adminapi.Client, now time.Time) *doctor.Report {
	r := &doctor.Report{}
	var st adminapi.Status
	if err := c.Get(ctx, adminapi.PathStatus, &st); err != nil {
		r.Add(doctor.Finding{Check: "admin", Target: c.Target(), Result: doctor.Fail, Detail: err.Error(),
			Fix: "start forgeyard-daemon with --admin-listen/--admin-socket and point --admin at it (with --token-file for TCP)"})
		return r
	}
	r.Add(doctor.Finding{Check: "admin", Target: c.Target(), Result: doctor.OK, Detail: "admin endpoint answers (daemon " + tablecell.Dash(st.Daemon) + ")"})
	if len(st.Listeners) == 0 {
		r.Add(doctor.Finding{Check: "listeners", Result: doctor.Fail, Detail: "the daemon has no listener", Fix: "set listen.quic (and listen.yamux for networks that block UDP)"})
	}
	backends := map[string]bool{}
	for _, l := range st.Listeners {
		target := l.Backend + " " + l.Address
		if l.State == adminapi.ListenerUp {
			backends[l.Backend] = true
			r.Add(doctor.Finding{Check: "listener", Target: target, Result: doctor.OK, Detail: "accepting connections"})
			continue
		}
		r.Add(doctor.Finding{Check: "listener", Target: target, Result: doctor.Fail, Detail: "not accepting: " + tablecell.Dash(l.Error),
			Fix: "restart the daemon; check the port is free (ss -lunpt) and the address exists on this host"})
	}
	if len(backends) > 0 && !backends["yamux"] && !backends["webtransport"] {
		r.Add(doctor.Finding{Check: "fallback", Result: doctor.Warn, Detail: "only QUIC (UDP) is served: agents behind networks that block UDP cannot connect",
			Fix: "also set listen.yamux (TCP 7444) or run a relay"})
	}
	switch ce := st.Certificate; {
	case ce == nil:
		r.Add(doctor.Finding{Check: "certificate", Result: doctor.Fail, Detail: "the daemon reports no server certificate", Fix: "set tls.certificate and tls.private_key"})
	case !ce.Valid && now.After(ce.NotAfter):
		r.Add(doctor.Finding{Check: "certificate", Target: ce.Subject, Result: doctor.Fail,
			Detail: fmt.Sprintf("server certificate expired at %s; agents refuse it", ce.NotAfter.Format(time.RFC3339)),
			Fix:    "issue a new server certificate, replace tls.certificate/tls.private_key and restart the daemon"})
	case !ce.Valid:
		r.Add(doctor.Finding{Check: "certificate", Target: ce.Subject, Result: doctor.Fail,
			Detail: fmt.Sprintf("server certificate is valid only from %s", ce.NotBefore.Format(time.RFC3339)),
			Fix:    "check this host's clock (timedatectl) or the certificate's issue date"})
	case ce.NotAfter.Sub(now) < trust.DefaultExpiryWarningWindow:
		r.Add(doctor.Finding{Check: "certificate", Target: ce.Subject, Result: doctor.Warn,
			Detail: fmt.Sprintf("server certificate expires at %s (%d days)", ce.NotAfter.Format(time.RFC3339), ce.DaysToExpiry),
			Fix:    "rotate tls.certificate before it expires"})
	default:
		r.Add(doctor.Finding{Check: "certificate", Target: ce.Subject, Result: doctor.OK,
			Detail: fmt.Sprintf("valid until %s (%d days)", ce.NotAfter.Format("2006-01-02"), ce.DaysToExpiry)})
	}
	if a := st.Authority; a.Reachable {
		r.Add(doctor.Finding{Check: "authority", Target: a.Backend, Result: doctor.OK, Detail: fmt.Sprintf("answers in %.1f ms", a.LatencyMs)})
	} else {
		fix := "check authority.sqlite (path, disk space, permissions)"
		if a.Backend == "postgres" {
			fix = "check PostgreSQL is up and reachable from this host and the DSN in authority.postgres_dsn_file"
		}
		r.Add(doctor.Finding{Check: "authority", Target: a.Backend, Result: doctor.Fail, Detail: "does not answer: " + a.Error, Fix: fix})
	}
	if st.Draining {
		r.Add(doctor.Finding{Check: "draining", Result: doctor.Warn, Detail: "the daemon is shutting down and sending agents away", Fix: "start it again, or make sure another daemon takes the agents"})
	}
	if st.Connections == 0 {
		r.Add(doctor.Finding{Check: "agents", Result: doctor.Warn, Detail: "no agent is connected",
			Fix: "run `forgeyard-agent doctor` on an agent host to see why it cannot connect"})
	} else {
		r.Add(doctor.Finding{Check: "agents", Result: doctor.OK, Detail: fmt.Sprintf("%d connections%s, %d sessions", st.Connections, tablecell.ByBackend(st.ConnectionsByBackend), st.Sessions)})
	}
	if st.HandshakeFailures > 0 {
		r.Add(doctor.Finding{Check: "handshakes", Result: doctor.Warn,
			Detail: fmt.Sprintf("%d TLS handshakes failed over a certificate since start (rejected, expired or missing client certificate, or an agent that rejected the daemon's)", st.HandshakeFailures),
			Fix:    "read the daemon's audit records (event=auth.failure with a backend attribute) for the remote address, reason and certificate"})
	} else {
		r.Add(doctor.Finding{Check: "handshakes", Result: doctor.OK, Detail: "no TLS handshake failed over a certificate since start"})
	}
	if st.RegistrationFailures > 0 {
		r.Add(doctor.Finding{Check: "registrations", Result: doctor.Warn, Detail: fmt.Sprintf("%d hellos or registrations refused since start", st.RegistrationFailures),
			Fix: "read the daemon's audit records (event=auth.failure, protocol.downgrade_rejected, runner.revoked) for who and why"})
	} else {
		r.Add(doctor.Finding{Check: "registrations", Result: doctor.OK, Detail: "no refused hello or registration since start"})
	}
	return r
}
