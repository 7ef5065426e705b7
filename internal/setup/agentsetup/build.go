package agentsetup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/trust"
)

// Build is the start-up of an agent-like process (forgeyard-agent,
// forgeyard-signer) from its configuration (defaults applied, validated):
//
//  1. one keepalive for every TCP endpoint (the proxy or NAT that cuts
//     idle tunnels is on all their paths), adapting to the cuts it sees
//     unless control_plane.disable_keepalive_adapt;
//  2. the rotatable credential and one dialer per endpoint (NewDialing):
//     the dialers ask for the current certificate at every handshake, and
//     the agent renews it before expiry (§21), rewriting the files;
//  3. the agent.Config of the file: fallback policy and stagger,
//     capabilities, parallelism, heartbeat misses, backoff, logger.
//
// The host adds what is its own (Executor, Role, Version, Features, Hooks,
// Metrics, Tracing, Protocol) and calls agent.New.
func Build(cfg *config.Agent, log *slog.Logger) (agent.Config, error) {
	ka := NewKeepAlive(cfg.ControlPlane.KeepAliveInterval.Duration, !cfg.ControlPlane.DisableKeepAliveAdapt, log)
	d, err := NewDialing(cfg.ControlPlane, cfg.Endpoints(), log, ka)
	if err != nil {
		return agent.Config{}, err
	}
	return agent.Config{
		Fallback:        Policy(cfg.Fallback),
		FallbackStagger: EndpointStagger(cfg.Fallback),
		Runner:          d.Credential.Runner, Credentials: d.Credentials,
		Endpoints:       d.Endpoints,
		Capabilities:    cfg.RunnerCapabilities(),
		MaxParallel:     cfg.MaxParallel,
		HeartbeatMisses: cfg.HeartbeatMisses,
		Backoff: agent.Backoff{Base: cfg.Backoff.Base.Duration, Max: cfg.Backoff.Max.Duration,
			AuthAfter: cfg.Backoff.AuthAfter, AuthMax: cfg.Backoff.AuthMax.Duration},
		Logger: log,
	}, nil
}

// StartFailed reports an agent-like process that could not be made
// (agent.New failed): "prog: err" on stderr, naming
// trust.MsgCredentialExpired and then hint when the certificate has
// expired; the status is cli.ExitUsage.
func StartFailed(stderr io.Writer, prog string, err error, hint string) int {
	if errors.Is(err, trust.ErrCertExpired) {
		err = fmt.Errorf("%w; %s%s", err, trust.MsgCredentialExpired, hint)
	}
	fmt.Fprintf(stderr, "%s: %v\n", prog, err)
	return cli.ExitUsage
}

// Run runs a until ctx ends (logged "<what> stopped", cli.ExitOK) or it
// fails (logged "<what> failed" at Error and "prog: err" on stderr,
// cli.ExitFail): the end of forgeyard-agent's and forgeyard-signer's run.
func Run(ctx context.Context, a *agent.Agent, log *slog.Logger, stderr io.Writer, prog, what string) int {
	err := a.Run(ctx)
	if ctx.Err() != nil {
		log.Info(what+" stopped", "session", a.Session())
		return cli.ExitOK
	}
	log.Error(what+" failed", "err", err)
	fmt.Fprintf(stderr, "%s: %v\n", prog, err)
	return cli.ExitFail
}
