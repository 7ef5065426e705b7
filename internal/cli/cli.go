// Package cli is the plumbing every forgeyard command shares and none
// owns: the process entry point (SIGINT/SIGTERM cancel the context), the
// exit statuses, parsing a flag set (--help on stdout, no stray
// arguments), loading a role's TOML configuration with the flags that were
// set overriding its keys, and serving an admin HTTP endpoint. Each
// command keeps only its own flags, keys and handlers.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"forgeyard.dev/transport/internal/config"
)

// Exit statuses of every command.
const (
	ExitOK    = 0 // success, or --help
	ExitFail  = 1 // a runtime failure
	ExitUsage = 2 // a usage or configuration error
)

// Main runs run with the process's arguments and standard streams and a
// context that SIGINT or SIGTERM cancels, and exits with its status.
func Main(run func(ctx context.Context, args []string, stdout, stderr io.Writer) int) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Parse parses args with fs (flag.ContinueOnError, output on stderr).
// ok is false when the command must exit with code: ExitOK after --help
// (printed on stdout), ExitUsage after a bad flag (fs printed why).
func Parse(fs *flag.FlagSet, args []string, stdout io.Writer) (code int, ok bool) {
	// flag prints the usage itself (on the set's output) for --help and for
	// a bad flag; it is printed here instead, once: --help on stdout, a
	// usage error on the set's output (stderr) after flag's message.
	usage := fs.Usage
	if usage == nil {
		usage = func() {
			fmt.Fprintf(fs.Output(), "Usage of %s:\n", fs.Name())
			fs.PrintDefaults()
		}
	}
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.Usage = usage
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			usage()
			return ExitOK, false
		}
		usage()
		return ExitUsage, false
	}
	return ExitOK, true
}

// SetUsage sets fs's usage to head, the flags' defaults, then tail.
func SetUsage(fs *flag.FlagSet, head, tail string) {
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), head)
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), tail)
	}
}

// ParseNoArgs is Parse for a command that takes flags only: a positional
// argument is "name: unexpected argument ..." on stderr and ExitUsage.
func ParseNoArgs(fs *flag.FlagSet, args []string, stdout, stderr io.Writer, name string) (code int, ok bool) {
	if code, ok := Parse(fs, args, stdout); !ok {
		return code, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n", name, fs.Arg(0))
		return ExitUsage, false
	}
	return ExitOK, true
}

// StringList is a repeatable string flag: each use appends its value.
type StringList []string

func (l *StringList) String() string     { return strings.Join(*l, ",") }
func (l *StringList) Set(s string) error { *l = append(*l, s); return nil }

// RoleFlags are the flags every role's command has: --config, and the
// [log] keys --log-level and --log-format.
type RoleFlags struct {
	ConfigFile          string
	LogLevel, LogFormat string
}

// NewRoleFlagSet is the root flag set of a role's command name
// (flag.ContinueOnError, output on out) with r's flags; --log-format only
// when logFormat is set.
func NewRoleFlagSet(name string, out io.Writer, r *RoleFlags, logFormat bool) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&r.ConfigFile, "config", "", "TOML configuration `file` (flags below override its keys)")
	fs.StringVar(&r.LogLevel, "log-level", "", "debug, info, warn or error (key: log.level; default info)")
	if logFormat {
		fs.StringVar(&r.LogFormat, "log-format", "", "text or json (key: log.format; default text)")
	}
	return fs
}

// ApplyLog writes the --log-level and --log-format that were set into l.
func (r *RoleFlags) ApplyLog(l *config.Logging, set config.SetFlags) {
	set.String("log-level", &l.Level, r.LogLevel)
	set.String("log-format", &l.Format, r.LogFormat)
}

// Configuration is a role's configuration (*config.Daemon, *config.Agent,
// *config.Relay).
type Configuration interface {
	ApplyDefaults()
	Validate() error
}

// LoadConfig builds a role's configuration: file read with read (none: the
// zero configuration), then override applies the flags of the parsed fs
// that were set, then the defaults, then validation, whose error names
// file.
func LoadConfig[C any, P interface {
	*C
	Configuration
}](fs *flag.FlagSet, file string, read func(string) (P, error), override func(P, config.SetFlags) error) (P, error) {
	cfg := P(new(C))
	if file != "" {
		c, err := read(file)
		if err != nil {
			return nil, err
		}
		cfg = c
	}
	if err := override(cfg, config.FlagsSet(fs)); err != nil {
		return nil, err
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, config.WithFile(err, file)
	}
	return cfg, nil
}

// ExitCodeOf is the exit status of a command that failed with err:
// ExitUsage for a configuration error (config.IsInvalid: an invalid key, a
// configured file that is missing or unusable, a credential trust
// refused), ExitFail for anything else, ExitOK for nil.
func ExitCodeOf(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case config.IsInvalid(err):
		return ExitUsage
	}
	return ExitFail
}
