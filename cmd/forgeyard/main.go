// Command forgeyard is the Forgeyard Transport operator CLI.
//
//	forgeyard dev-certs [flags]   create a development PKI (CA, server, agents)
//	forgeyard transport status|sessions|protocols|doctor [--admin URL] [--token-file FILE] [--json]
//	forgeyard runner token create|list|revoke, runner disable|enable,
//	forgeyard runner cert list|revoke   runner identity lifecycle
//	forgeyard version [--json], forgeyard --version
//	forgeyard completion bash|zsh|fish, forgeyard man
//
// Subcommands are the tree newRoot builds (an internal/cli.Command each);
// each leaf parses its own flags with the standard flag package, groups
// (`forgeyard transport ...`) dispatch with cli.Dispatch. The same tree
// gives --help, the shell completions and the man page.
//
// Exit status (internal/cli.ExitCodes): 0 on success, 1 when the command
// failed, 2 on a usage or configuration error.
package main

import (
	"flag"
	"io"
	"os"

	"forgeyard.dev/transport/internal/cli"
)

// prog is the program name in messages.
const prog = "forgeyard"

// root is the command tree.
var root = newRoot()

func newRoot() *cli.Command {
	r := &cli.Command{Name: prog, Summary: "the Forgeyard Transport operator CLI: development PKI, daemon inspection, runner identities",
		Synopsis: "<command> [flags]",
		Sub: []*cli.Command{
			{Name: "dev-certs", Summary: "create or complete a development PKI (CA, server and agent certificates)", Run: runDevCerts,
				Flags: func() *flag.FlagSet { return devCertsFlags(new(devCertsOpts)) }},
			{Name: "transport", Summary: "inspect a running daemon: status, sessions, protocols, doctor", Sub: transportCommands()},
			{Name: "runner", Summary: "runner identities: enrollment tokens, disable/enable, certificate revocation", Sub: runnerCommands()},
		}}
	cli.StandardCommands(r)
	return r
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without the process: it is what tests call.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && cli.IsVersionFlag(args[0]) {
		return cli.PrintVersion(prog, stdout)
	}
	return cli.Dispatch(prog, root, args, stdout, stderr)
}
