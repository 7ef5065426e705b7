package cli

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
)

// RoleConfig is a server role's configuration (*config.Daemon,
// *config.Relay): it makes the logger of its [log] section.
type RoleConfig interface {
	NewLogger(w io.Writer) *slog.Logger
}

// RunRole is the run of a server role's command (forgeyard-relay,
// forgeyard-daemon) once its command tree root and root flag set fs are
// made: args are parsed (ParseRoot); build checks the parsed flags and
// loads the configuration, an error being "NAME: error" on stderr and
// ExitUsage; serve runs the role with the configuration's logger (on
// stderr) until ctx ends (ExitOK) or it fails, logged at Error as "<what>
// failed" with the status ExitCodeOf gives (2 for a configured file that is
// missing or refused).
func RunRole[C RoleConfig](root *Command, fs *flag.FlagSet, args []string, stdout, stderr io.Writer,
	what string, build func() (C, error), serve func(cfg C, log *slog.Logger) error) int {
	if code, ok := ParseRoot(root, fs, args, stdout, stderr); !ok {
		return code
	}
	cfg, err := build()
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", root.Name, err)
		return ExitUsage
	}
	log := cfg.NewLogger(stderr)
	if err := serve(cfg, log); err != nil {
		log.Error(what+" failed", "err", err)
		return ExitCodeOf(err)
	}
	return ExitOK
}
