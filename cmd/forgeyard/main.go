// Command forgeyard is the Forgeyard Transport operator CLI.
//
//	forgeyard dev-certs [flags]   create a development PKI (CA, server, agents)
//	forgeyard transport status|sessions|protocols|doctor [--admin URL] [--token-file FILE] [--json]
//	forgeyard runner token create|list|revoke, runner disable|enable,
//	forgeyard runner cert list|revoke   runner identity lifecycle
//
// Subcommands are registered in the commands table below; each parses its
// own flags with the standard flag package. Groups of subcommands
// (`forgeyard transport ...`, see transport.go) are commands whose run
// function dispatches again with dispatch.
//
// Exit status: 0 on success, 1 when the command failed, 2 on a usage error.
package main

import (
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"forgeyard.dev/transport/internal/cli"
)

// Exit codes.
const (
	exitOK    = cli.ExitOK
	exitFail  = cli.ExitFail
	exitUsage = cli.ExitUsage
)

// command is one subcommand. run receives the arguments after the command
// name and returns the exit code.
type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

// commands are the top-level subcommands, in help order.
var commands = []command{
	{name: "dev-certs", summary: "create or complete a development PKI (CA, server and agent certificates)", run: runDevCerts},
	{name: "transport", summary: "inspect a running daemon: status, sessions, protocols, doctor", run: runTransport},
	{name: "runner", summary: "runner identities: enrollment tokens, disable/enable, certificate revocation (runner.go)", run: runRunner},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without the process: it is what tests call.
func run(args []string, stdout, stderr io.Writer) int {
	return dispatch("forgeyard", commands, args, stdout, stderr)
}

// dispatch runs the subcommand named by args[0] from cmds.
func dispatch(prog string, cmds []command, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(prog, cmds, stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(prog, cmds, stdout)
		return exitOK
	}
	for _, c := range cmds {
		if c.name == args[0] {
			return c.run(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "%s: unknown command %q\n\n", prog, args[0])
	usage(prog, cmds, stderr)
	return exitUsage
}

func usage(prog string, cmds []command, w io.Writer) {
	fmt.Fprintf(w, "Usage: %s <command> [flags]\n\nCommands:\n", prog)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range cmds {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nRun '%s <command> --help' for a command's flags.\n", prog)
}
