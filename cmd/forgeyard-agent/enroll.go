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
func runEnroll(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("forgeyard-agent enroll", flag.ContinueOnError)
	fl.SetOutput(stderr)
	token := fl.String("token", "", "one-time enrollment `token` (fyet_...)")
	endpoint := fl.String("endpoint", "", "daemon endpoint `URI` (quic://host:7443, yamux://host:7444, webtransport://host:443)")
	ca := fl.String("ca", "", "CA PEM `file` that signs the daemon certificate (default: system roots)")
	serverName := fl.String("server-name", "", "`name` checked against the daemon certificate (default: the endpoint host)")
	certOut := fl.String("cert", "", "where to write the issued certificate (PEM `file`)")
	keyOut := fl.String("key", "", "where to write the new private key (PEM `file`, mode 0600)")
	force := fl.Bool("force", false, "replace existing --cert/--key files")
	timeout := fl.Duration("timeout", 30*time.Second, "give up after this long")
	fl.Usage = func() {
		fmt.Fprint(fl.Output(), enrollHelp)
		fl.PrintDefaults()
	}
	if code, ok := cli.Parse(fl, args, stdout); !ok {
		return code
	}
	usage := func(msg string) int {
		fmt.Fprintf(stderr, "forgeyard-agent enroll: %s\n", msg)
		return exitUsage
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
		return exitFail
	}
	if err := trust.WriteCredentialFiles(*certOut, *keyOut, en.Chain, en.Key); err != nil {
		fmt.Fprintf(stderr, "forgeyard-agent enroll: %v\n", err)
		return exitFail
	}
	fmt.Fprintf(stdout, "enrolled as runner %s\ncertificate %s (serial %s) valid until %s\nkey %s\n",
		en.Runner, *certOut, trust.SerialString(en.Leaf), en.Leaf.NotAfter.UTC().Format(time.RFC3339), *keyOut)
	return exitOK
}
