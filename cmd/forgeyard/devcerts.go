package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/semantics/trust"
)

// defaultDevPKIDir is where dev-certs writes when --dir is not given.
const defaultDevPKIDir = "forgeyard-dev-pki"

// maxDevAgentsFlag bounds --agents.
const maxDevAgentsFlag = 1000

const devCertsHelp = `Usage: forgeyard dev-certs [--dir DIR] [--agents N | --agent NAME...] [--server-name NAME...] [--force] [--json]

Create (or complete) a development PKI for running a Forgeyard daemon and
agents locally. NOT for production: the CA key sits next to the certificates.

Files written to DIR (keys are ECDSA P-256, mode 0600):
  ca.pem, ca-key.pem                 development CA (valid 1 year)
  server.pem, server-key.pem         daemon certificate for localhost, 127.0.0.1,
                                     ::1 and every --server-name (valid 90 days)
  agent-NAME.pem, agent-NAME-key.pem one per agent, bound to a fresh RunnerId by
                                     the URI SAN forgeyard://runner/<ULID> (90 days)
  dev-pki.json                       manifest: agent names -> RunnerIds, files, expiry

Running it again is safe: existing files are verified and reused, agents keep
their RunnerIds, and only missing certificates are created. Files that cannot
be reused (half a key pair, a certificate from another CA, a server certificate
without a requested name) are reported and left alone; --force regenerates
everything, with new RunnerIds.

Flags:
`

// devCertsOpts are dev-certs' flag values.
type devCertsOpts struct {
	dir                 string
	count               int
	agents, serverNames cli.StringList
	force, asJSON       bool
}

// devCertsFlags is dev-certs' flag set, writing into o.
func devCertsFlags(o *devCertsOpts) *flag.FlagSet {
	fs := flag.NewFlagSet("forgeyard dev-certs", flag.ContinueOnError)
	fs.StringVar(&o.dir, "dir", defaultDevPKIDir, "directory for the PKI files (created with mode 0700)")
	fs.IntVar(&o.count, "agents", 0, "number of agent certificates, named 1..N (default 1 when no --agent is given)")
	fs.BoolVar(&o.force, "force", false, "regenerate the CA, server and every agent, replacing existing files")
	fs.BoolVar(&o.asJSON, "json", false, "print the result as JSON instead of a table")
	fs.Var(&o.agents, "agent", "agent `NAME` (repeatable; letters, digits, '.', '_', '-')")
	fs.Var(&o.serverNames, "server-name", "extra DNS name or IP `NAME` for the server certificate (repeatable)")
	cli.SetUsage(fs, devCertsHelp, "")
	return fs
}

func runDevCerts(args []string, stdout, stderr io.Writer) int {
	var o devCertsOpts
	fs := devCertsFlags(&o)
	fs.SetOutput(stderr)
	if code, ok := cli.Parse(fs, args, stdout); !ok {
		return code // flag already printed the error and usage
	}
	dir, count, agents, serverNames, force, asJSON := &o.dir, &o.count, o.agents, o.serverNames, &o.force, &o.asJSON
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "forgeyard dev-certs: "+format+"\n", a...)
		fmt.Fprintln(stderr, "Run 'forgeyard dev-certs --help' for usage.")
		return cli.ExitUsage
	}
	if fs.NArg() > 0 {
		return usageErr("unexpected argument %q", fs.Arg(0))
	}
	countSet := false
	fs.Visit(func(f *flag.Flag) { countSet = countSet || f.Name == "agents" })
	switch {
	case countSet && len(agents) > 0:
		return usageErr("use either --agents N or --agent NAME, not both")
	case countSet && (*count < 1 || *count > maxDevAgentsFlag):
		return usageErr("--agents must be between 1 and %d", maxDevAgentsFlag)
	case *dir == "":
		return usageErr("--dir must not be empty")
	}
	names := []string(agents)
	if len(names) == 0 {
		n := *count
		if n == 0 {
			n = 1
		}
		for i := 1; i <= n; i++ {
			names = append(names, strconv.Itoa(i))
		}
	}

	pki, err := trust.GenerateDevPKI(*dir, trust.DevPKIOptions{Agents: names, ServerNames: serverNames, Force: *force})
	if err != nil {
		if errors.Is(err, trust.ErrInvalidDevPKIOptions) {
			return usageErr("%v", err)
		}
		fmt.Fprintf(stderr, "forgeyard dev-certs: %v\n", err)
		return cli.ExitFail
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(pki); err != nil {
			fmt.Fprintf(stderr, "forgeyard dev-certs: %v\n", err)
			return cli.ExitFail
		}
	} else {
		printDevPKI(stdout, pki)
	}
	for _, w := range pki.Warnings {
		fmt.Fprintf(stderr, "warning: %s\n", w)
	}
	return cli.ExitOK
}

func printDevPKI(w io.Writer, p *trust.DevPKI) {
	state := func(c trust.DevCert) string {
		if c.Created {
			return "created"
		}
		return "reused"
	}
	files := func(c trust.DevCert) string {
		return filepath.Base(c.CertFile) + ", " + filepath.Base(c.KeyFile)
	}
	day := func(t time.Time) string { return "expires " + t.UTC().Format("2006-01-02") }

	fmt.Fprintf(w, "Forgeyard development PKI in %s\n(development only: the CA key is stored next to the certificates)\n\n", p.Dir)
	tw := newTable(w)
	fmt.Fprintf(tw, "  CA\t%s\t%s\t%s\t\n", files(p.CA), state(p.CA), day(p.CA.NotAfter))
	fmt.Fprintf(tw, "  server\t%s\t%s\t%s\tnames: %s\n", files(p.Server.DevCert), state(p.Server.DevCert), day(p.Server.NotAfter), strings.Join(p.Server.Names, ", "))
	for _, a := range p.Agents {
		fmt.Fprintf(tw, "  agent %s\t%s\t%s\t%s\trunner %s\n", a.Name, files(a.DevCert), state(a.DevCert), day(a.NotAfter), a.Runner)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nManifest: %s\n", p.Manifest)
}
