package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/agentsetup"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/trust"
)

const enrollHelp = `Usage: forgeyard-agent enroll --token TOKEN --endpoint URI --ca FILE --cert FILE --key FILE [--server-name NAME] [--force]

Enrolls this machine as a new runner (§20): generates a private key HERE
(it never leaves this machine), sends a certificate signing request with the
one-time TOKEN (from 'forgeyard runner token create') over TLS that
authenticates the daemon (no client certificate yet), and writes the
certificate the daemon issues - bound to a fresh RunnerId - and the key to
--cert and --key (key mode 0600). Run the agent with them afterwards; it
renews the certificate over its session before it expires.

Flags:
`

// runEnroll is `forgeyard-agent enroll`.
// enrollOpts are enroll's flag values.
type enrollOpts struct {
	token, endpoint, ca, serverName, certOut, keyOut string
	force                                            bool
	timeout                                          time.Duration
}

// enrollFlagSet is enroll's flag set, writing into o.
func enrollFlagSet(o *enrollOpts, out io.Writer) *flag.FlagSet {
	fl := flag.NewFlagSet("forgeyard-agent enroll", flag.ContinueOnError)
	fl.SetOutput(out)
	fl.StringVar(&o.token, "token", "", "one-time enrollment `token` (fyet_...)")
	fl.StringVar(&o.endpoint, "endpoint", "", "daemon endpoint `URI` (quic://host:7443, yamux://host:7444, webtransport://host:443)")
	fl.StringVar(&o.ca, "ca", "", "CA PEM `file` that signs the daemon certificate (default: system roots)")
	fl.StringVar(&o.serverName, "server-name", "", "`name` checked against the daemon certificate (default: the endpoint host)")
	fl.StringVar(&o.certOut, "cert", "", "where to write the issued certificate (PEM `file`)")
	fl.StringVar(&o.keyOut, "key", "", "where to write the new private key (PEM `file`, mode 0600)")
	fl.BoolVar(&o.force, "force", false, "replace existing --cert/--key files")
	fl.DurationVar(&o.timeout, "timeout", 30*time.Second, "give up after this long")
	cli.SetUsage(fl, enrollHelp, "")
	return fl
}

func runEnroll(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o enrollOpts
	fl := enrollFlagSet(&o, stderr)
	if code, ok := cli.ParseNoArgs(fl, args, stdout, stderr, "forgeyard-agent enroll"); !ok {
		return code
	}
	token, endpoint, ca, serverName, certOut, keyOut, force, timeout := &o.token, &o.endpoint, &o.ca, &o.serverName, &o.certOut, &o.keyOut, &o.force, &o.timeout
	usage := func(msg string) int {
		fmt.Fprintf(stderr, "forgeyard-agent enroll: %s\n", msg)
		return cli.ExitUsage
	}
	switch {
	case *token == "":
		return usage("--token is required")
	case *endpoint == "":
		return usage("--endpoint is required")
	case *certOut == "" || *keyOut == "":
		return usage("--cert and --key (output files) are required")
	}
	if err := trust.CheckEnrollmentToken(*token); err != nil {
		return usage(err.Error())
	}
	if !*force {
		for _, p := range []string{*certOut, *keyOut} {
			if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
				return usage(fmt.Sprintf("%s exists; this machine may already be enrolled (use --force to replace it)", p))
			}
		}
	}
	ep, err := config.ParseEndpoint(*endpoint)
	if err != nil {
		return usage(err.Error())
	}
	client, err := trust.ClientConfig(trust.ClientFiles{CAFile: *ca, ServerName: *serverName})
	if err != nil {
		return usage(err.Error())
	}
	d, addr, err := agentsetup.Dialer(ep, client, quic.Config{}, yamux.Config{})
	if err != nil {
		return usage(err.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	en, err := agent.Enroll(ctx, agent.EnrollRequest{Endpoint: agent.Endpoint{Address: addr, Dialer: d, Backend: ep.Backend},
		Token: *token, Version: Version})
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard-agent enroll: %v\n", err)
		return cli.ExitFail
	}
	if err := trust.WriteCredentialFiles(*certOut, *keyOut, en.Chain, en.Key); err != nil {
		fmt.Fprintf(stderr, "forgeyard-agent enroll: %v\n", err)
		return cli.ExitFail
	}
	fmt.Fprintf(stdout, "enrolled as runner %s\ncertificate %s (serial %s) valid until %s\nkey %s\n",
		en.Runner, *certOut, trust.SerialString(en.Leaf), en.Leaf.NotAfter.UTC().Format(time.RFC3339), *keyOut)
	return cli.ExitOK
}
