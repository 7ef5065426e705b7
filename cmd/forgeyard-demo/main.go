// Command forgeyard-demo shows Forgeyard Transport end to end in one
// process, with no arguments and no prior setup (`make demo`):
//
//  1. creates (or reuses) a development PKI in ./.demo/pki and a fresh
//     SQLite authority in ./.demo/authority.db;
//  2. starts a daemon on QUIC, TLS+yamux and WebTransport loopback on free
//     ports, and an in-process forgeyard-relay (relay.New) that accepts
//     agents over TLS+yamux and dials the daemon over QUIC;
//  3. starts agents, each through its own impairment proxy
//     (internal/tools/netsim: UDP for QUIC and WebTransport, TCP for TLS+yamux),
//     with roles in a fixed order (agentRoles): 1 QUIC (cut), 2 TLS+yamux
//     through the relay, 3 WebTransport, 4 TLS+yamux, 5 and beyond QUIC;
//  4. dispatches a batch of leases (offer → accept → phases → completion)
//     run by the synthetic executor, with payloads and outputs through CAS,
//     and cancels one long attempt on agent 2 while tailing its log;
//  5. cuts agent 1's path right after the daemon commits one of its
//     completions and before the ack can reach it: the agent reconnects
//     under the same agent session, resyncs, retries the completion with
//     the same MessageId and gets DuplicateAccepted;
//  6. shows the two other peer roles (§191, roles.go): a signing worker
//     signs a digest over the payload with a 0600 file key once its policy
//     proof verifies (and refuses one the policy authority did not attest),
//     and a device agent with a simulated phone is discovered, reserved,
//     installs an artifact from the daemon's CAS, runs a test suite whose
//     log streams in live, and is reset (the old reservation is then
//     refused);
//  7. prints a summary (each agent's backend, path and the transport the
//     daemon saw) and checks the authority: the exit status is 0 only if
//     every accepted attempt completed exactly once (and the signature and
//     the device run checked out).
//
// Flags (all optional): -agents, -leases, -dir, -v (daemon and agent logs
// to stderr).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"forgeyard.dev/transport/internal/cli"
)

func main() { cli.Main(run) }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if code, ok := cli.VersionOnly("forgeyard-demo", args, stdout, stderr); ok {
		return code
	}
	p := defaultParams()
	fs := flag.NewFlagSet("forgeyard-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&p.Dir, "dir", p.Dir, "working `directory` for the dev PKI and the authority database")
	fs.IntVar(&p.Agents, "agents", p.Agents, "number of agents (2–16): quic (cut), relay+yamux, webtransport, yamux, then quic")
	fs.IntVar(&p.Leases, "leases", p.Leases, "number of leases to dispatch (at least 2×agents+1, at most 1000)")
	verbose := fs.Bool("v", false, "log daemon and agent events to stderr")
	if code, ok := cli.Parse(fs, args, stdout); !ok {
		return code
	}
	if p.Agents < 2 || p.Agents > 16 || p.Leases < 2*p.Agents+1 || p.Leases > 1000 || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "forgeyard-demo: -agents must be 2–16, -leases 2×agents+1 to 1000, and no arguments")
		return 2
	}
	if *verbose {
		p.Log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	p.Progress = stdout
	rep, err := runDemo(ctx, p)
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard-demo: %v\n", err)
		if rep == nil {
			return 1
		}
		rep.Pass, rep.Failure = false, err.Error()
	}
	rep.print(stdout)
	if !rep.Pass {
		fmt.Fprintln(stdout, "\nFAIL:", rep.Failure)
		return 1
	}
	return 0
}
