package cli

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"

	"forgeyard.dev/transport/internal/buildinfo"
)

// Command is one entry of a command's tree: a program (the root), a group
// of subcommands, or a subcommand. The same tree drives dispatch (for the
// groups that use Dispatch), the usage listing, the shell completions and
// the man page, so what a user can type and what is documented cannot
// differ.
type Command struct {
	Name    string // as typed: "forgeyard", "runner", "list"
	Summary string // one line, no trailing period
	// Run runs the command with the arguments after its name; nil for a
	// group, whose Sub are dispatched.
	Run func(args []string, stdout, stderr io.Writer) int
	Sub []*Command
	// Flags, when set, returns the command's flag set (its values
	// discarded): the completions and the man page list its flags.
	Flags func() *flag.FlagSet
	// Synopsis is the man page's SYNOPSIS line after the command path, e.g.
	// "[--config FILE] [flags]"; default "[flags]".
	Synopsis string
	// Args are the fixed positional values the command takes, for
	// completion (e.g. completion's shells).
	Args []string
}

// Find returns the subcommand named name.
func (c *Command) Find(name string) *Command {
	for _, s := range c.Sub {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// Walk calls fn for c and every command below it, depth first, with its
// path from the root ("forgeyard runner token list").
func (c *Command) Walk(fn func(path string, c *Command)) {
	var walk func(prefix string, c *Command)
	walk = func(prefix string, c *Command) {
		p := c.Name
		if prefix != "" {
			p = prefix + " " + c.Name
		}
		fn(p, c)
		for _, s := range c.Sub {
			walk(p, s)
		}
	}
	walk("", c)
}

// Dispatch runs the subcommand of group named by args[0]. prog is the
// group's path for messages ("forgeyard runner"). No argument prints the
// usage on stderr (ExitUsage); help, -h, --help print it on stdout.
func Dispatch(prog string, group *Command, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		GroupUsage(prog, group, stderr)
		return ExitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		GroupUsage(prog, group, stdout)
		return ExitOK
	}
	if s := group.Find(args[0]); s != nil && s.Run != nil {
		return s.Run(args[1:], stdout, stderr)
	} else if s != nil {
		return Dispatch(prog+" "+s.Name, s, args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "%s: unknown command %q\n\n", prog, args[0])
	GroupUsage(prog, group, stderr)
	return ExitUsage
}

// GroupUsage prints a group's subcommands with their summaries.
func GroupUsage(prog string, group *Command, w io.Writer) {
	fmt.Fprintf(w, "Usage: %s <command> [flags]\n\nCommands:\n", prog)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range group.Sub {
		fmt.Fprintf(tw, "  %s\t%s\n", c.Name, c.Summary)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nRun '%s <command> --help' for a command's flags.\n", prog)
}

// IsVersionFlag reports whether arg asks for the version: --version or
// -version (the flag package accepts both spellings for every flag).
func IsVersionFlag(arg string) bool { return arg == "--version" || arg == "-version" }

// PrintVersion prints prog's one-line version (--version) on stdout.
func PrintVersion(prog string, stdout io.Writer) int {
	fmt.Fprintln(stdout, buildinfo.Get().String(prog))
	return ExitOK
}

// VersionCommand is the `version [--json]` subcommand of prog: the module
// version, commit, Go version and protocol range, as lines or JSON.
func VersionCommand(prog string) *Command {
	newFS := func() (*flag.FlagSet, *bool) {
		fs := flag.NewFlagSet(prog+" version", flag.ContinueOnError)
		asJSON := fs.Bool("json", false, "print JSON instead of lines")
		return fs, asJSON
	}
	return &Command{Name: "version", Summary: "print the version, commit, Go version and protocol range of this build",
		Synopsis: "[--json]",
		Flags:    func() *flag.FlagSet { fs, _ := newFS(); return fs },
		Run: func(args []string, stdout, stderr io.Writer) int {
			fs, asJSON := newFS()
			fs.SetOutput(stderr)
			if code, ok := ParseNoArgs(fs, args, stdout, stderr, prog+" version"); !ok {
				return code
			}
			i := buildinfo.Get()
			if !*asJSON {
				fmt.Fprint(stdout, i.Lines(prog))
				return ExitOK
			}
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(map[string]any{"program": prog, "module": i.Module, "version": i.Version, "commit": i.Commit,
				"modified": i.Modified, "go_version": i.GoVersion,
				"protocol_min": i.Protocol.Min.String(), "protocol_max": i.Protocol.Max.String()})
			return ExitOK
		}}
}

// CompletionCommand is the `completion bash|zsh|fish` subcommand: it prints
// the completion script for root's tree.
func CompletionCommand(root *Command) *Command {
	return &Command{Name: "completion", Summary: "print the shell completion script (bash, zsh or fish)",
		Synopsis: "bash|zsh|fish", Args: Shells,
		Run: func(args []string, stdout, stderr io.Writer) int {
			if len(args) == 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
				fmt.Fprintf(stdout, "Usage: %s completion bash|zsh|fish\n\nPrints the completion script for the shell, e.g.\n  %s completion bash > /etc/bash_completion.d/%s\n", root.Name, root.Name, root.Name)
				return ExitOK
			}
			if len(args) != 1 {
				fmt.Fprintf(stderr, "%s completion: want one shell: bash, zsh or fish\n", root.Name)
				return ExitUsage
			}
			if err := WriteCompletion(stdout, args[0], root); err != nil {
				fmt.Fprintf(stderr, "%s completion: %v\n", root.Name, err)
				return ExitUsage
			}
			return ExitOK
		}}
}

// ManCommand is the `man` subcommand: it prints root's man page (roff,
// section 1) on stdout.
func ManCommand(root *Command) *Command {
	return &Command{Name: "man", Summary: "print the manual page (roff, section 1)",
		Run: func(args []string, stdout, stderr io.Writer) int {
			if len(args) == 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
				fmt.Fprintf(stdout, "Usage: %s man > %s.1\n\nPrints the manual page, generated from the same command table as --help.\n", root.Name, root.Name)
				return ExitOK
			}
			if len(args) != 0 {
				fmt.Fprintf(stderr, "%s man: unexpected argument %q\n", root.Name, args[0])
				return ExitUsage
			}
			WriteMan(stdout, root)
			return ExitOK
		}}
}

// StandardCommands appends version, completion and man to root's
// subcommands: every command has them.
func StandardCommands(root *Command) {
	root.Sub = append(root.Sub, VersionCommand(root.Name), CompletionCommand(root), ManCommand(root))
}

// RoleRoot is the command tree of a role's command (forgeyard-daemon,
// forgeyard-relay, forgeyard-agent): the role itself, run with the root
// flags that flags returns, its subcommands sub, then StandardCommands.
func RoleRoot(name, summary string, flags func() *flag.FlagSet, sub ...*Command) *Command {
	r := &Command{Name: name, Summary: summary, Synopsis: "[--config FILE] [flags]", Flags: flags, Sub: sub}
	StandardCommands(r)
	return r
}

// ParseRoot reads the arguments of a command whose root takes flags: a
// subcommand of root (Subcommand) runs and ends the command; anything else
// is the root's own flags, parsed with fs and no positional argument
// (ParseNoArgs). ok is false when the command must exit with code.
func ParseRoot(root *Command, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	if code, done := Subcommand(root, args, stdout, stderr); done {
		return code, false
	}
	return ParseNoArgs(fs, args, stdout, stderr, root.Name)
}

// VersionOnly is Subcommand for a program whose only subcommand is
// `version [--json]` (with --version): ok is false when args are for the
// program itself.
func VersionOnly(prog string, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	return Subcommand(&Command{Name: prog, Sub: []*Command{VersionCommand(prog)}}, args, stdout, stderr)
}

// Subcommand handles what a program whose root takes flags (a daemon, the
// agent) accepts before them: --version as the first argument, or the name
// of one of root's subcommands (groups dispatched further). ok is false
// when args are for the root itself.
func Subcommand(root *Command, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	if len(args) == 0 {
		return ExitOK, false
	}
	if IsVersionFlag(args[0]) {
		return PrintVersion(root.Name, stdout), true
	}
	c := root.Find(args[0])
	if c == nil {
		return ExitOK, false
	}
	if c.Run != nil {
		return c.Run(args[1:], stdout, stderr), true
	}
	return Dispatch(root.Name+" "+c.Name, c, args[1:], stdout, stderr), true
}
