package cli

import (
	"bytes"
	"flag"
	"io"
	"strings"
	"testing"

	"forgeyard.dev/transport/internal/config"
)

func TestRoleFlags(t *testing.T) {
	var r RoleFlags
	var list StringList
	fs := NewRoleFlagSet("role", io.Discard, &r, true)
	fs.Var(&list, "item", "repeatable")
	if err := fs.Parse([]string{"--config", "c.toml", "--log-level", "debug", "--item", "a", "--item", "b"}); err != nil {
		t.Fatal(err)
	}
	if r.ConfigFile != "c.toml" || list.String() != "a,b" {
		t.Errorf("config %q, items %q", r.ConfigFile, list.String())
	}
	l := config.Logging{Level: "info", Format: "json"}
	r.ApplyLog(&l, config.FlagsSet(fs))
	if l.Level != "debug" || l.Format != "json" { // --log-format not given: the file's value stays
		t.Errorf("log %+v", l)
	}
	if NewRoleFlagSet("signer", io.Discard, new(RoleFlags), false).Lookup("log-format") != nil {
		t.Error("--log-format registered without logFormat")
	}
}

func TestSetUsage(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.String("v", "", "a `value`")
	SetUsage(fs, "Usage: x\n\nFlags:\n", "\nExamples:\n  x -v 1\n")
	var out bytes.Buffer
	fs.SetOutput(&out)
	fs.Usage()
	if got := out.String(); !strings.HasPrefix(got, "Usage: x\n\nFlags:\n  -v value\n") || !strings.HasSuffix(got, "\nExamples:\n  x -v 1\n") {
		t.Errorf("usage:\n%s", got)
	}
}

func TestParseRoot(t *testing.T) {
	var ran bool
	flags := func() *flag.FlagSet { fs, _ := newFS(io.Discard); return fs }
	root := RoleRoot("prog", "a role", flags, &Command{Name: "sub", Summary: "a subcommand",
		Run: func([]string, io.Writer, io.Writer) int { ran = true; return ExitFail }})
	if root.Find("version") == nil || root.Find("man") == nil || root.Synopsis != "[--config FILE] [flags]" {
		t.Errorf("root %+v lacks the standard commands or synopsis", root)
	}
	var stdout, stderr bytes.Buffer
	fs, v := newFS(&stderr)
	if code, ok := ParseRoot(root, fs, []string{"sub"}, &stdout, &stderr); ok || code != ExitFail || !ran {
		t.Errorf("subcommand: code %d ok %v ran %v", code, ok, ran)
	}
	if code, ok := ParseRoot(root, fs, []string{"-v", "1"}, &stdout, &stderr); !ok || code != ExitOK || *v != "1" {
		t.Errorf("root flags: code %d ok %v v %q", code, ok, *v)
	}
	fs, _ = newFS(&stderr)
	if code, ok := ParseRoot(root, fs, []string{"extra"}, &stdout, &stderr); ok || code != ExitUsage ||
		!strings.Contains(stderr.String(), `prog: unexpected argument "extra"`) {
		t.Errorf("argument: code %d ok %v stderr %q", code, ok, stderr.String())
	}
}
