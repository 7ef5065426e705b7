package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
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
func runnerCommands() []*cli.Command {
	return []*cli.Command{
		{Name: "token", Summary: "create, list or revoke one-time enrollment tokens", Sub: []*cli.Command{
			{Name: "create", Summary: "create a one-time enrollment token (printed once; only its hash is stored)", Run: runTokenCreate,
				Flags: func() *flag.FlagSet { return tokenCreateFlags(new(tokenCreateOpts)) }},
			{Name: "list", Summary: "list enrollment tokens (never the secrets)", Run: runTokenList,
				Flags: func() *flag.FlagSet { return listFlags("forgeyard runner token list", new(listOpts), false) }},
			{Name: "revoke", Summary: "revoke an unused token by its id", Run: runTokenRevoke,
				Flags: func() *flag.FlagSet { return tokenRevokeFlags(new(tokenRevokeOpts)) }},
		}},
		{Name: "disable", Summary: "disable (revoke) a runner: its sessions close on every daemon, reconnects are refused", Run: runRunnerDisable,
			Flags: func() *flag.FlagSet { return setRunnerFlags("forgeyard runner disable", new(setRunnerOpts)) }},
		{Name: "enable", Summary: "re-enable a disabled runner", Run: runRunnerEnable,
			Flags: func() *flag.FlagSet { return setRunnerFlags("forgeyard runner enable", new(setRunnerOpts)) }},
		{Name: "cert", Summary: "list or revoke a runner's certificates", Sub: []*cli.Command{
			{Name: "list", Summary: "list a runner's issued certificates", Run: runCertList,
				Flags: func() *flag.FlagSet { return listFlags("forgeyard runner cert list", new(listOpts), true) }},
			{Name: "revoke", Summary: "revoke a certificate by serial: sessions using it close on every daemon", Run: runCertRevoke,
				Flags: func() *flag.FlagSet { return certRevokeFlags(new(certRevokeOpts)) }},
		}},
		// Over the daemon's admin endpoint (runner_admin.go):
		{Name: "list", Summary: "the runner inventory: capabilities, connection, last heartbeat, health, drain (--json)", Run: runRunnerList,
			Flags: adminCommandFlags("list", runnerListHelp, nil)},
		{Name: "show", Summary: "one runner of the inventory (--json)", Run: runRunnerShow,
			Flags: adminCommandFlags("show", runnerShowHelp, nil)},
		{Name: "drain", Summary: "drain a runner on every daemon: no new leases (audited)", Run: runRunnerDrain,
			Flags: adminCommandFlags("drain", runnerDrainHelp, drainFlags(new(string)))},
		{Name: "resume", Summary: "end a runner's drain (audited)", Run: runRunnerResume,
			Flags: adminCommandFlags("resume", runnerResumeHelp, nil)},
		{Name: "refresh-capabilities", Summary: "ask a runner's agent for its current capabilities (audited)", Run: runRunnerRefresh,
			Flags: adminCommandFlags("refresh-capabilities", runnerRefreshHelp, nil)},
		{Name: "probe", Summary: "run a built-in health probe on a runner: connectivity, disk, clock, full (audited)", Run: runRunnerProbe,
			Flags: adminCommandFlags("probe", runnerProbeHelp, probeFlags(new(string)))},
	}
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

// open opens the selected authority, which must exist: a missing file,
// mistyped path or conflicting flags are configuration errors (ExitUsage),
// an authority that exists but cannot be opened (PostgreSQL down, a
// corrupt database) a runtime failure (ExitFail). code is the exit status
// to return with err.
func (a *authorityFlags) open(ctx context.Context) (au authority.Authority, ids authority.Identities, code int, err error) {
	au, ids, err = a.openAuthority(ctx)
	var oe *openError
	if errors.As(err, &oe) {
		return nil, nil, cli.ExitFail, oe.err
	}
	return au, ids, cli.ExitUsage, err
}

// openError is a failure to open an authority that exists.
type openError struct{ err error }

func (e *openError) Error() string { return e.err.Error() }

func (a *authorityFlags) openAuthority(ctx context.Context) (authority.Authority, authority.Identities, error) {
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
	if ac.SQLite == "" && ac.PostgresDSNFile != "" {
		if _, err := os.Stat(ac.PostgresDSNFile); err != nil {
			return nil, nil, fmt.Errorf("authority.postgres_dsn_file %q: %w", ac.PostgresDSNFile, err)
		}
	}
	au, err := daemonsetup.OpenAuthority(ctx, ac)
	if err != nil {
		return nil, nil, &openError{err}
	}
	ids := authority.IdentitiesOf(au)
	if ids == nil {
		au.Close()
		return nil, nil, errors.New("this authority does not store runner identities")
	}
	return au, ids, nil
}

// authorityCommand is the frame of a command on the authority: it parses
// args with fs (flags only, errors on stderr), runs check (nil or an error
// printed as a usage error), opens af's authority and runs do with it,
// closing it after. Errors print as "<fs.Name()>: <err>"; do's are
// ExitFail.
func authorityCommand(fs *flag.FlagSet, af *authorityFlags, args []string, stdout, stderr io.Writer,
	check func() error, do func(ctx context.Context, au authority.Authority, ids authority.Identities) error) int {
	fs.SetOutput(stderr)
	if code, ok := cli.ParseNoArgs(fs, args, stdout, stderr, fs.Name()); !ok {
		return code
	}
	if check != nil {
		if err := check(); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), err)
			return cli.ExitUsage
		}
	}
	ctx := context.Background()
	au, ids, code, err := af.open(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), err)
		return code
	}
	defer au.Close()
	if err := do(ctx, au, ids); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), err)
		return cli.ExitFail
	}
	return cli.ExitOK
}

type tokenCreateOpts struct {
	af     authorityFlags
	name   string
	ttl    time.Duration
	labels cli.StringList
}

func tokenCreateFlags(o *tokenCreateOpts) *flag.FlagSet {
	fs := flag.NewFlagSet("forgeyard runner token create", flag.ContinueOnError)
	o.af.register(fs)
	fs.StringVar(&o.name, "name", "", "intended runner `name` (the certificate's common name)")
	fs.DurationVar(&o.ttl, "ttl", trust.DefaultTokenTTL, "how long the token stays usable")
	fs.Var(&o.labels, "label", "intended runner `label`, repeatable")
	return fs
}

func runTokenCreate(args []string, stdout, stderr io.Writer) int {
	var o tokenCreateOpts
	check := func() error {
		if o.ttl <= 0 || o.ttl > 30*24*time.Hour {
			return errors.New("--ttl must be between 1s and 720h")
		}
		return nil
	}
	return authorityCommand(tokenCreateFlags(&o), &o.af, args, stdout, stderr, check, func(ctx context.Context, _ authority.Authority, ids authority.Identities) error {
		tok, err := trust.NewEnrollmentToken()
		if err != nil {
			return err
		}
		now := time.Now().UTC()
		rec := authority.EnrollmentToken{Hash: trust.HashEnrollmentToken(tok), ID: trust.EnrollmentTokenID(tok), Name: o.name,
			Labels: o.labels, CreatedAt: now, ExpiresAt: now.Add(o.ttl)}
		if err := ids.CreateEnrollmentToken(ctx, rec); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "token:   %s\nid:      %s\nexpires: %s\n\nThe token is shown once and works once. Enroll with:\n  forgeyard-agent enroll --token %s --endpoint quic://DAEMON:7443 --ca CA.pem --cert agent.pem --key agent-key.pem\n",
			tok, rec.ID, rec.ExpiresAt.Format(time.RFC3339), tok)
		return nil
	})
}

// listOpts are the flags of the listings: the authority, --json and,
// for cert list, --runner.
type listOpts struct {
	af     authorityFlags
	asJSON bool
	runner string
}

func listFlags(name string, o *listOpts, withRunner bool) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	o.af.register(fs)
	fs.BoolVar(&o.asJSON, "json", false, "print JSON instead of a table")
	if withRunner {
		fs.StringVar(&o.runner, "runner", "", "RunnerId (ULID)")
	}
	return fs
}

// tokenJSON is one row of `runner token list --json`.
type tokenJSON struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Labels    []string  `json:"labels"`
	State     string    `json:"state"` // unused, used, revoked, expired
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
	UsedAt    time.Time `json:"used_at,omitzero"`
	Runner    string    `json:"runner,omitempty"`
}

func runTokenList(args []string, stdout, stderr io.Writer) int {
	var o listOpts
	return authorityCommand(listFlags("forgeyard runner token list", &o, false), &o.af, args, stdout, stderr, nil,
		func(ctx context.Context, _ authority.Authority, ids authority.Identities) error {
			toks, err := ids.EnrollmentTokens(ctx, 1000)
			if err != nil {
				return err
			}
			printTokens(stdout, toks, o.asJSON)
			return nil
		})
}

// printTokens prints token list's rows, as JSON or a table.
func printTokens(stdout io.Writer, toks []authority.EnrollmentToken, asJSON bool) {
	now := time.Now()
	rows := make([]tokenJSON, 0, len(toks))
	for _, t := range toks {
		r := tokenJSON{ID: t.ID, Name: t.Name, Labels: t.Labels, State: "unused", CreatedAt: t.CreatedAt.UTC(), ExpiresAt: t.ExpiresAt.UTC()}
		if r.Labels == nil {
			r.Labels = []string{}
		}
		switch {
		case !t.UsedAt.IsZero():
			r.State, r.UsedAt, r.Runner = "used", t.UsedAt.UTC(), t.Runner.String()
		case t.Revoked:
			r.State = "revoked"
		case !t.ExpiresAt.After(now):
			r.State = "expired"
		}
		rows = append(rows, r)
	}
	if asJSON {
		printJSON(stdout, rows)
		return
	}
	tw := newTable(stdout, "ID", "NAME", "STATE", "EXPIRES", "RUNNER")
	for _, r := range rows {
		state, runner := r.State, "-"
		if r.State == "used" {
			state, runner = "used "+r.UsedAt.Format(time.RFC3339), r.Runner
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.ID, r.Name, state, r.ExpiresAt.Format(time.RFC3339), runner)
	}
	tw.Flush()
}

type tokenRevokeOpts struct {
	af authorityFlags
	id string
}

func tokenRevokeFlags(o *tokenRevokeOpts) *flag.FlagSet {
	fs := flag.NewFlagSet("forgeyard runner token revoke", flag.ContinueOnError)
	o.af.register(fs)
	fs.StringVar(&o.id, "id", "", "token `id` (from token create or token list)")
	return fs
}

func runTokenRevoke(args []string, stdout, stderr io.Writer) int {
	var o tokenRevokeOpts
	check := requiredFlag("id", &o.id)
	return authorityCommand(tokenRevokeFlags(&o), &o.af, args, stdout, stderr, check, func(ctx context.Context, _ authority.Authority, ids authority.Identities) error {
		if err := ids.RevokeEnrollmentToken(ctx, o.id, time.Now()); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "token %s revoked\n", o.id)
		return nil
	})
}

// requiredFlag is the check of a command whose string flag --name (its
// value *v) must be set.
func requiredFlag(name string, v *string) func() error {
	return func() error {
		if *v == "" {
			return errors.New("--" + name + " is required")
		}
		return nil
	}
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

type setRunnerOpts struct {
	af             authorityFlags
	runner, reason string
}

func setRunnerFlags(prog string, o *setRunnerOpts) *flag.FlagSet {
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	o.af.register(fs)
	fs.StringVar(&o.runner, "runner", "", "RunnerId (ULID)")
	fs.StringVar(&o.reason, "reason", "", "reason, recorded and shown to the runner's operator")
	return fs
}

func setRunner(verb string, enabled bool, args []string, stdout, stderr io.Writer) int {
	var o setRunnerOpts
	var runner wire.RunnerId
	check := func() (err error) {
		runner, err = parseRunner(o.runner)
		return err
	}
	return authorityCommand(setRunnerFlags("forgeyard runner "+verb, &o), &o.af, args, stdout, stderr, check, func(ctx context.Context, au authority.Authority, _ authority.Identities) error {
		if !enabled && o.reason == "" {
			o.reason = "disabled by an operator"
		}
		if err := au.SetRunnerEnabled(ctx, runner, enabled, o.reason, time.Now()); err != nil {
			return err
		}
		if enabled {
			fmt.Fprintf(stdout, "runner %s enabled\n", runner)
		} else {
			fmt.Fprintf(stdout, "runner %s disabled: its live sessions close on every daemon within the revocation poll (default 2s); its leases are revoked and reconnects refused\n", runner)
		}
		return nil
	})
}

// certJSON is one row of `runner cert list --json`.
type certJSON struct {
	Serial   string    `json:"serial"`
	IssuedAt time.Time `json:"issued_at"`
	NotAfter time.Time `json:"not_after"`
	Revoked  bool      `json:"revoked"`
	Reason   string    `json:"reason,omitempty"`
}

func runCertList(args []string, stdout, stderr io.Writer) int {
	var o listOpts
	var runner wire.RunnerId
	check := func() (err error) {
		runner, err = parseRunner(o.runner)
		return err
	}
	return authorityCommand(listFlags("forgeyard runner cert list", &o, true), &o.af, args, stdout, stderr, check,
		func(ctx context.Context, _ authority.Authority, ids authority.Identities) error {
			certs, err := ids.Certificates(ctx, runner)
			if err != nil {
				return err
			}
			printCerts(stdout, certs, o.asJSON)
			return nil
		})
}

// printCerts prints cert list's rows, as JSON or a table.
func printCerts(stdout io.Writer, certs []authority.IssuedCertificate, asJSON bool) {
	if asJSON {
		rows := make([]certJSON, 0, len(certs))
		for _, c := range certs {
			rows = append(rows, certJSON{Serial: c.Serial, IssuedAt: c.IssuedAt.UTC(), NotAfter: c.NotAfter.UTC(), Revoked: c.Revoked, Reason: c.Reason})
		}
		printJSON(stdout, rows)
		return
	}
	tw := newTable(stdout, "SERIAL", "ISSUED", "NOT AFTER", "STATE")
	for _, c := range certs {
		state := "valid"
		if c.Revoked {
			state = "revoked: " + c.Reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.Serial, c.IssuedAt.Format(time.RFC3339), c.NotAfter.Format(time.RFC3339), state)
	}
	tw.Flush()
}

type certRevokeOpts struct {
	af             authorityFlags
	serial, reason string
}

func certRevokeFlags(o *certRevokeOpts) *flag.FlagSet {
	fs := flag.NewFlagSet("forgeyard runner cert revoke", flag.ContinueOnError)
	o.af.register(fs)
	fs.StringVar(&o.serial, "serial", "", "certificate serial (hex, from cert list)")
	fs.StringVar(&o.reason, "reason", "revoked by an operator", "reason, recorded")
	return fs
}

func runCertRevoke(args []string, stdout, stderr io.Writer) int {
	var o certRevokeOpts
	check := requiredFlag("serial", &o.serial)
	return authorityCommand(certRevokeFlags(&o), &o.af, args, stdout, stderr, check, func(ctx context.Context, _ authority.Authority, ids authority.Identities) error {
		if err := ids.RevokeCertificate(ctx, o.serial, o.reason, time.Now()); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "certificate %s revoked: sessions using it close on every daemon within the revocation poll; reconnects with it are refused\n", o.serial)
		return nil
	})
}
