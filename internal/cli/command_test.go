package cli

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"forgeyard.dev/transport/internal/buildinfo"
)

// testTree is a program with a flag, a group and leaves.
func testTree(ran *[]string) *Command {
	leaf := func(name string) *Command {
		return &Command{Name: name, Summary: "the " + name + " leaf",
			Flags: func() *flag.FlagSet {
				fs := flag.NewFlagSet(name, flag.ContinueOnError)
				fs.String("sqlite", "", "database `path`")
				fs.Bool("json", false, "print JSON")
				return fs
			},
			Run: func(args []string, stdout, stderr io.Writer) int {
				*ran = append(*ran, name+" "+strings.Join(args, " "))
				return ExitOK
			}}
	}
	r := &Command{Name: "prog", Summary: "a test program",
		Flags: func() *flag.FlagSet {
			fs := flag.NewFlagSet("prog", flag.ContinueOnError)
			fs.String("config", "", "configuration `file`")
			return fs
		},
		Sub: []*Command{
			{Name: "runner", Summary: "runner things", Sub: []*Command{
				{Name: "token", Summary: "tokens", Sub: []*Command{leaf("list"), leaf("create")}},
				leaf("disable"),
			}},
		}}
	StandardCommands(r)
	return r
}

func TestDispatch(t *testing.T) {
	var ran []string
	r := testTree(&ran)
	for _, c := range []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{[]string{"runner", "token", "list", "--json"}, ExitOK, "", ""},
		{[]string{"runner", "--help"}, ExitOK, "Usage: prog runner <command>", ""},
		{[]string{"runner"}, ExitUsage, "", "Usage: prog runner <command>"},
		{[]string{"runner", "nope"}, ExitUsage, "", `prog runner: unknown command "nope"`},
		{[]string{"version"}, ExitOK, "prog " + buildinfo.Get().Version + "\n", ""},
		{[]string{"completion"}, ExitUsage, "", "want one shell"},
		{[]string{"completion", "tcsh"}, ExitUsage, "", `unknown shell "tcsh"`},
		{[]string{"man", "extra"}, ExitUsage, "", "unexpected argument"},
	} {
		var o, e bytes.Buffer
		code := Dispatch("prog", r, c.args, &o, &e)
		if code != c.code || !strings.Contains(o.String(), c.stdout) || !strings.Contains(e.String(), c.stderr) ||
			(c.stdout == "" && o.Len() > 0 && code != ExitOK) {
			t.Errorf("%q: exit %d stdout %q stderr %q; want %d, %q, %q", c.args, code, o.String(), e.String(), c.code, c.stdout, c.stderr)
		}
	}
	if len(ran) != 1 || ran[0] != "list --json" {
		t.Errorf("ran %q", ran)
	}
}

func TestSubcommand(t *testing.T) {
	var ran []string
	r := testTree(&ran)
	var o, e bytes.Buffer
	if code, ok := Subcommand(r, []string{"--config", "x.toml"}, &o, &e); ok {
		t.Errorf("root flags taken as a subcommand: %d", code)
	}
	if code, ok := Subcommand(r, nil, &o, &e); ok {
		t.Errorf("no arguments taken as a subcommand: %d", code)
	}
	if code, ok := Subcommand(r, []string{"--version"}, &o, &e); !ok || code != ExitOK || o.String() != buildinfo.Get().String("prog")+"\n" {
		t.Errorf("--version: %d %v %q", code, ok, o.String())
	}
	o.Reset()
	if code, ok := Subcommand(r, []string{"runner", "disable", "--sqlite", "a.db"}, &o, &e); !ok || code != ExitOK || len(ran) != 1 {
		t.Errorf("runner disable: %d %v %q", code, ok, ran)
	}
	o.Reset()
	if code, ok := Subcommand(r, []string{"version", "--json"}, &o, &e); !ok || code != ExitOK {
		t.Fatalf("version --json: %d %v", code, ok)
	}
	var v map[string]any
	if err := json.Unmarshal(o.Bytes(), &v); err != nil || v["program"] != "prog" || v["version"] != buildinfo.Get().Version || v["protocol_max"] == "" {
		t.Errorf("version --json: %v %s", err, o.String())
	}
}

// TestCompletionBash sources the bash script and completes as bash would.
func TestCompletionBash(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal("bash is needed to test the bash completion:", err)
	}
	var ran []string
	r := testTree(&ran)
	var script bytes.Buffer
	if err := WriteCompletion(&script, "bash", r); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "prog.bash")
	if err := os.WriteFile(file, script.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		words []string // the command line, the last one being completed
		want  string
	}{
		{[]string{"prog", ""}, "runner version completion man --config --help --version"},
		{[]string{"prog", "ru"}, "runner"},
		{[]string{"prog", "runner", "t"}, "token"},
		{[]string{"prog", "--config", "a.toml", "runner", "token", ""}, "list create --help"},
		{[]string{"prog", "runner", "token", "list", "--"}, "--json --sqlite --help"},
		{[]string{"prog", "completion", "z"}, "zsh"},
	} {
		words := make([]string, len(c.words))
		for i, w := range c.words {
			words[i] = "'" + w + "'"
		}
		sh := "source " + file + "; COMP_WORDS=(" + strings.Join(words, " ") + "); COMP_CWORD=" +
			strconv.Itoa(len(c.words)-1) + "; _prog; echo \"${COMPREPLY[*]}\""
		out, err := exec.Command(bash, "--norc", "--noprofile", "-c", sh).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != c.want {
			t.Errorf("complete %q: %q (%v); want %q", c.words, out, err, c.want)
		}
	}
}

// TestCompletionShellsParse checks the zsh and fish scripts with the
// shells' own parsers when they are installed (bash always).
func TestCompletionShellsParse(t *testing.T) {
	var ran []string
	r := testTree(&ran)
	for _, c := range []struct {
		shell, bin string
		args       []string
	}{
		{"bash", "bash", []string{"-n"}}, {"zsh", "zsh", []string{"-n"}}, {"fish", "fish", []string{"--no-execute"}},
	} {
		var b bytes.Buffer
		if err := WriteCompletion(&b, c.shell, r); err != nil {
			t.Fatal(err)
		}
		for _, w := range []string{"runner token", "list create --help", "--config"} {
			if !strings.Contains(b.String(), w) {
				t.Errorf("%s completion lacks %q", c.shell, w)
			}
		}
		bin, err := exec.LookPath(c.bin)
		if err != nil {
			t.Logf("%s not installed: only the words of its completion are checked", c.bin)
			continue
		}
		file := filepath.Join(t.TempDir(), "prog."+c.shell)
		os.WriteFile(file, b.Bytes(), 0o644)
		if out, err := exec.Command(bin, append(c.args, file)...).CombinedOutput(); err != nil {
			t.Errorf("%s rejects its completion script: %v\n%s\n%s", c.shell, err, out, b.String())
		}
		if c.shell == "fish" {
			// fish completes as it would at a prompt.
			for line, want := range map[string]string{"prog runner t": "token", "prog runner token list --": "--help\n--json\n--sqlite"} {
				out, err := exec.Command(bin, "--no-config", "-c", "source "+file+"; complete -C '"+line+"'").CombinedOutput()
				if err != nil || strings.TrimSpace(string(out)) != want {
					t.Errorf("fish completes %q as %q (%v); want %q", line, out, err, want)
				}
			}
		}
	}
}

func TestMan(t *testing.T) {
	var ran []string
	r := testTree(&ran)
	var b bytes.Buffer
	WriteMan(&b, r)
	man := b.String()
	for _, want := range []string{".TH PROG 1", ".SH NAME\nprog \\- a test program", ".SH SYNOPSIS", ".B prog runner token list\n",
		"\\fB\\-\\-config\\fR \\fIfile\\fR", ".SH COMMANDS", ".SH EXIT STATUS\n.TP\n.B 0\n", ".B 2\na usage or configuration error"} {
		if !strings.Contains(man, want) {
			t.Errorf("man page lacks %q:\n%s", want, man)
		}
	}
	if p := DocProblems(r); len(p) > 0 {
		t.Errorf("DocProblems: %q", p)
	}
	// The check is not vacuous: a man page and completions that lack a
	// command or a flag are reported.
	var bash bytes.Buffer
	WriteCompletion(&bash, "bash", r)
	stale := strings.ReplaceAll(man, "token list", "token")
	stale = strings.ReplaceAll(stale, `\-\-sqlite`, `\-\-db`)
	p := docProblems(r, stale, map[string]string{"bash": strings.ReplaceAll(bash.String(), "list create", "create")})
	for _, want := range []string{`man page lacks "prog runner token list"`, `man page lacks flag --sqlite of "prog runner disable"`,
		`bash completion lacks the words of "prog runner token"`} {
		if !strings.Contains(strings.Join(p, "\n"), want) {
			t.Errorf("stale docs: problems %q lack %q", p, want)
		}
	}
	if groff, err := exec.LookPath("groff"); err == nil {
		cmd := exec.Command(groff, "-man", "-Tutf8", "-ww", "-z")
		cmd.Stdin = strings.NewReader(man)
		if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
			t.Errorf("groff warns about the man page: %v\n%s", err, out)
		}
	}
}

// TestExitCodesDocumented: docs/operations.md's exit-status table is
// cli.ExitCodes.
func TestExitCodesDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ExitCodes {
		if row := "| " + strconv.Itoa(e.Code) + " | " + e.Meaning + " |"; !strings.Contains(string(b), row) {
			t.Errorf("docs/operations.md lacks the row %q", row)
		}
	}
}
