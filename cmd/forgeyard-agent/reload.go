package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"forgeyard.dev/transport/semantics/agent"
)

// reloadCapabilities re-reads the configuration (the same file and flag
// overrides as at start) and applies what changes without a restart: the
// capability snapshot (labels, tools, CPU, memory, disk). The agent sends
// the daemon a CapabilityUpdateV1 when it changed (§94). Everything else,
// max_parallel included, needs a restart; a change there is logged. It
// reports whether the capabilities changed.
func reloadCapabilities(fs *flag.FlagSet, f *flags, running int, a *agent.Agent, log *slog.Logger) (bool, error) {
	cfg, err := buildConfig(fs, f)
	if err != nil {
		log.Error("configuration reload failed; keeping the current capabilities", "err", err)
		return false, err
	}
	if cfg.MaxParallel != running {
		log.Warn("max_parallel changed in the configuration; it takes effect at the next restart", "running", running, "configured", cfg.MaxParallel)
		cfg.MaxParallel = running
	}
	caps := cfg.RunnerCapabilities()
	changed, err := a.SetCapabilities(caps)
	if err != nil {
		log.Error("reloaded capabilities are invalid; keeping the current ones", "err", err)
		return false, err
	}
	if changed {
		log.Info("capabilities reloaded and sent to the daemon", "labels", caps.Labels, "tools", caps.Tools)
	} else {
		log.Info("configuration reloaded; capabilities unchanged", "labels", slices.Clone(caps.Labels))
	}
	return changed, nil
}

// reloadOnSIGHUP reloads the capabilities on every SIGHUP until ctx ends.
// ready, when not nil, is called once the signal handler is installed.
func reloadOnSIGHUP(ctx context.Context, fs *flag.FlagSet, f *flags, running int, a *agent.Agent, log *slog.Logger, ready func(), reloaded func(bool, error)) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	defer signal.Stop(ch)
	if ready != nil {
		ready()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			changed, err := reloadCapabilities(fs, f, running, a, log)
			if reloaded != nil {
				reloaded(changed, err)
			}
		}
	}
}
