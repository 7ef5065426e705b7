package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/oklog/ulid/v2"

	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/daemonsetup"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
)

// runnerCommands are the subcommands of `forgeyard runner`: runner
// identity lifecycle (§20, §224–225), acting directly on the authority the
// daemons share, so every daemon sees the change (revocations within their
// revocation poll, default 2 s).
var runnerCommands = []command{
	{name: "token", summary: "create, list or revoke one-time enrollment tokens", run: runRunnerToken},
	{name: "disable", summary: "disable (revoke) a runner: its sessions close on every daemon, reconnects are refused", run: runRunnerDisable},
	{name: "enable", summary: "re-enable a disabled runner", run: runRunnerEnable},
	{name: "cert", summary: "list or revoke a runner's certificates (cert list|revoke)", run: runRunnerCert},
	// Over the daemon's admin endpoint (runner_admin.go):
	{name: "list", summary: "the runner inventory: capabilities, connection, last heartbeat, health, drain (--json)", run: runRunnerList},
	{name: "show", summary: "one runner of the inventory (--json)", run: runRunnerShow},
	{name: "drain", summary: "drain a runner on every daemon: no new leases (audited)", run: runRunnerDrain},
	{name: "resume", summary: "end a runner's drain (audited)", run: runRunnerResume},
	{name: "refresh-capabilities", summary: "ask a runner's agent for its current capabilities (audited)", run: runRunnerRefresh},
	{name: "probe", summary: "run a built-in health probe on a runner: connectivity, disk, clock, full (audited)", run: runRunnerProbe},
}

func runRunner(args []string, stdout, stderr io.Writer) int {
	return dispatch("forgeyard runner", runnerCommands, args, stdout, stderr)
}

// authorityFlags selects the authority: a daemon configuration file, or
// the store directly.
type authorityFlags struct {
	configFile, sqlite, dsnFile string
}

func (a *authorityFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.configFile, "config", "", "daemon TOML configuration `file` whose [authority] to use")
	fs.StringVar(&a.sqlite, "sqlite", "", "SQLite authority database `path` (instead of --config)")
	fs.StringVar(&a.dsnFile, "postgres-dsn-file", "", "`file` holding the PostgreSQL DSN (instead of --config)")
}

func (a *authorityFlags) open(ctx context.Context) (authority.Authority, authority.Identities, error) {
	var ac config.AuthorityConfig
	switch {
	case a.configFile != "" && (a.sqlite != "" || a.dsnFile != ""):
		return nil, nil, errors.New("give --config or --sqlite/--postgres-dsn-file, not both")
	case a.configFile != "":
		d, err := config.ReadDaemon(a.configFile)
		if err != nil {
			return nil, nil, err
		}
		ac = d.Authority
	case a.sqlite != "" && a.dsnFile != "":
		return nil, nil, errors.New("give --sqlite or --postgres-dsn-file, not both")
	case a.sqlite != "" || a.dsnFile != "":
		ac = config.AuthorityConfig{SQLite: a.sqlite, PostgresDSNFile: a.dsnFile}
	default:
		return nil, nil, errors.New("no authority: give --config, --sqlite or --postgres-dsn-file")
	}
	if ac.SQLite != "" {
		// Operator commands never create an authority: a mistyped path
		// would otherwise get a new, empty database and a "done".
		if _, err := os.Stat(ac.SQLite); err != nil {
			return nil, nil, fmt.Errorf("authority.sqlite %q: %w (the daemon creates it on its first start; check the path)", ac.SQLite, err)
		}
	}
	au, err := daemonsetup.OpenAuthority(ctx, ac)
	if err != nil {
		return nil, nil, err
	}
	ids := authority.IdentitiesOf(au)
	if ids == nil {
		au.Close()
		return nil, nil, errors.New("this authority does not store runner identities")
	}
	return au, ids, nil
}

// parseFlags parses args; it returns -1 to continue, or an exit code.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) int {
	if code, ok := cli.Parse(fs, args, stdout); !ok {
		return code
	}
	return -1
}

func runRunnerToken(args []string, stdout, stderr io.Writer) int {
	cmds := []command{
		{name: "create", summary: "create a one-time enrollment token (printed once; only its hash is stored)", run: runTokenCreate},
		{name: "list", summary: "list enrollment tokens (never the secrets)", run: runTokenList},
		{name: "revoke", summary: "revoke an unused token by its id", run: runTokenRevoke},
	}
	return dispatch("forgeyard runner token", cmds, args, stdout, stderr)
}

func runTokenCreate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("forgeyard runner token create", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var af authorityFlags
	af.register(fs)
	name := fs.String("name", "", "intended runner `name` (the certificate's common name)")
	ttl := fs.Duration("ttl", trust.DefaultTokenTTL, "how long the token stays usable")
	var labels stringList
	fs.Var(&labels, "label", "intended runner `label`, repeatable")
	if c := parseFlags(fs, args, stdout); c >= 0 {
		return c
	}
	if *ttl <= 0 || *ttl > 30*24*time.Hour {
		fmt.Fprintln(stderr, "forgeyard runner token create: --ttl must be between 1s and 720h")
		return exitUsage
	}
	ctx := context.Background()
	au, ids, err := af.open(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard runner token create: %v\n", err)
		return exitUsage
	}
	defer au.Close()
	tok, err := trust.NewEnrollmentToken()
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard runner token create: %v\n", err)
		return exitFail
	}
	now := time.Now().UTC()
	rec := authority.EnrollmentToken{Hash: trust.HashEnrollmentToken(tok), ID: trust.EnrollmentTokenID(tok), Name: *name,
		Labels: labels, CreatedAt: now, ExpiresAt: now.Add(*ttl)}
	if err := ids.CreateEnrollmentToken(ctx, rec); err != nil {
		fmt.Fprintf(stderr, "forgeyard runner token create: %v\n", err)
		return exitFail
	}
	fmt.Fprintf(stdout, "token:   %s\nid:      %s\nexpires: %s\n\nThe token is shown once and works once. Enroll with:\n  forgeyard-agent enroll --token %s --endpoint quic://DAEMON:7443 --ca CA.pem --cert agent.pem --key agent-key.pem\n",
		tok, rec.ID, rec.ExpiresAt.Format(time.RFC3339), tok)
	return exitOK
}

func runTokenList(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("forgeyard runner token list", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var af authorityFlags
	af.register(fs)
	if c := parseFlags(fs, args, stdout); c >= 0 {
		return c
	}
	ctx := context.Background()
	au, ids, err := af.open(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard runner token list: %v\n", err)
		return exitUsage
	}
	defer au.Close()
	toks, err := ids.EnrollmentTokens(ctx, 1000)
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard runner token list: %v\n", err)
		return exitFail
	}
	now := time.Now()
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSTATE\tEXPIRES\tRUNNER")
	for _, t := range toks {
		state, runner := "unused", "-"
		switch {
		case !t.UsedAt.IsZero():
			state, runner = "used "+t.UsedAt.Format(time.RFC3339), t.Runner.String()
		case t.Revoked:
			state = "revoked"
		case !t.ExpiresAt.After(now):
			state = "expired"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.ID, t.Name, state, t.ExpiresAt.Format(time.RFC3339), runner)
	}
	tw.Flush()
	return exitOK
}

func runTokenRevoke(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("forgeyard runner token revoke", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var af authorityFlags
	af.register(fs)
	id := fs.String("id", "", "token `id` (from token create or token list)")
	if c := parseFlags(fs, args, stdout); c >= 0 {
		return c
	}
	if *id == "" {
		fmt.Fprintln(stderr, "forgeyard runner token revoke: --id is required")
		return exitUsage
	}
	ctx := context.Background()
	au, ids, err := af.open(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard runner token revoke: %v\n", err)
		return exitUsage
	}
	defer au.Close()
	if err := ids.RevokeEnrollmentToken(ctx, *id, time.Now()); err != nil {
		fmt.Fprintf(stderr, "forgeyard runner token revoke: %v\n", err)
		return exitFail
	}
	fmt.Fprintf(stdout, "token %s revoked\n", *id)
	return exitOK
}

func parseRunner(s string) (wire.RunnerId, error) {
	s = strings.TrimPrefix(s, trust.RunnerURIScheme+"://"+trust.RunnerURIHost+"/")
	u, err := ulid.ParseStrict(strings.ToUpper(s))
	if err != nil || u == (ulid.ULID{}) {
		return wire.RunnerId{}, fmt.Errorf("--runner %q is not a RunnerId (26-character ULID)", s)
	}
	return wire.RunnerId{ULID: u}, nil
}

func runRunnerDisable(args []string, stdout, stderr io.Writer) int {
	return setRunner("disable", false, args, stdout, stderr)
}

func runRunnerEnable(args []string, stdout, stderr io.Writer) int {
	return setRunner("enable", true, args, stdout, stderr)
}

func setRunner(verb string, enabled bool, args []string, stdout, stderr io.Writer) int {
	prog := "forgeyard runner " + verb
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var af authorityFlags
	af.register(fs)
	runnerFlag := fs.String("runner", "", "RunnerId (ULID)")
	reason := fs.String("reason", "", "reason, recorded and shown to the runner's operator")
	if c := parseFlags(fs, args, stdout); c >= 0 {
		return c
	}
	runner, err := parseRunner(*runnerFlag)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return exitUsage
	}
	if !enabled && *reason == "" {
		*reason = "disabled by an operator"
	}
	ctx := context.Background()
	au, _, err := af.open(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return exitUsage
	}
	defer au.Close()
	if err := au.SetRunnerEnabled(ctx, runner, enabled, *reason, time.Now()); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return exitFail
	}
	if enabled {
		fmt.Fprintf(stdout, "runner %s enabled\n", runner)
	} else {
		fmt.Fprintf(stdout, "runner %s disabled: its live sessions close on every daemon within the revocation poll (default 2s); its leases are revoked and reconnects refused\n", runner)
	}
	return exitOK
}

func runRunnerCert(args []string, stdout, stderr io.Writer) int {
	cmds := []command{
		{name: "list", summary: "list a runner's issued certificates", run: runCertList},
		{name: "revoke", summary: "revoke a certificate by serial: sessions using it close on every daemon", run: runCertRevoke},
	}
	return dispatch("forgeyard runner cert", cmds, args, stdout, stderr)
}

func runCertList(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("forgeyard runner cert list", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var af authorityFlags
	af.register(fs)
	runnerFlag := fs.String("runner", "", "RunnerId (ULID)")
	if c := parseFlags(fs, args, stdout); c >= 0 {
		return c
	}
	runner, err := parseRunner(*runnerFlag)
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard runner cert list: %v\n", err)
		return exitUsage
	}
	ctx := context.Background()
	au, ids, err := af.open(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard runner cert list: %v\n", err)
		return exitUsage
	}
	defer au.Close()
	certs, err := ids.Certificates(ctx, runner)
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard runner cert list: %v\n", err)
		return exitFail
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERIAL\tISSUED\tNOT AFTER\tSTATE")
	for _, c := range certs {
		state := "valid"
		if c.Revoked {
			state = "revoked: " + c.Reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.Serial, c.IssuedAt.Format(time.RFC3339), c.NotAfter.Format(time.RFC3339), state)
	}
	tw.Flush()
	return exitOK
}

func runCertRevoke(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("forgeyard runner cert revoke", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var af authorityFlags
	af.register(fs)
	serial := fs.String("serial", "", "certificate serial (hex, from cert list)")
	reason := fs.String("reason", "revoked by an operator", "reason, recorded")
	if c := parseFlags(fs, args, stdout); c >= 0 {
		return c
	}
	if *serial == "" {
		fmt.Fprintln(stderr, "forgeyard runner cert revoke: --serial is required")
		return exitUsage
	}
	ctx := context.Background()
	au, ids, err := af.open(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard runner cert revoke: %v\n", err)
		return exitUsage
	}
	defer au.Close()
	if err := ids.RevokeCertificate(ctx, *serial, *reason, time.Now()); err != nil {
		fmt.Fprintf(stderr, "forgeyard runner cert revoke: %v\n", err)
		return exitFail
	}
	fmt.Fprintf(stdout, "certificate %s revoked: sessions using it close on every daemon within the revocation poll; reconnects with it are refused\n", *serial)
	return exitOK
}
