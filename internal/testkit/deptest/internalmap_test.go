package deptest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

// The map of internal/ and cmd/ is a Markdown table in docs/architecture.md
// under internalMapHeader: one row per package, "| `path` | kind | what |".
const internalMapHeader = "| package | kind | what it is |"

// Kinds of the internal/ and cmd/ map.
const (
	kindProduct  = "product command"
	kindToolCmd  = "tool command"
	kindPlumbing = "plumbing"
	kindTool     = "tool"
	kindTestKit  = "test kit"
)

var internalKinds = map[string]bool{kindProduct: true, kindToolCmd: true, kindPlumbing: true, kindTool: true, kindTestKit: true}

// internalMap parses the rows of the table (package → kind).
func internalMap(text string) (map[string]string, []string) {
	rows := map[string]string{}
	var bad []string
	lines := mapTableWith(text, internalMapHeader)
	if len(lines) < 2 {
		return nil, []string{"docs/architecture.md has no table headed " + internalMapHeader}
	}
	for _, l := range lines[2:] {
		cells := strings.Split(strings.Trim(l, "|"), "|")
		if len(cells) != 3 {
			bad = append(bad, fmt.Sprintf("row %q: %d cells, want 3", l, len(cells)))
			continue
		}
		pkg, kind := strings.TrimSpace(cells[0]), strings.TrimSpace(cells[1])
		if !strings.HasPrefix(pkg, "`") || !strings.HasSuffix(pkg, "`") {
			bad = append(bad, fmt.Sprintf("row %q: the package is not in backticks", l))
			continue
		}
		pkg = strings.Trim(pkg, "`")
		switch {
		case !internalKinds[kind]:
			bad = append(bad, fmt.Sprintf("row %s: unknown kind %q", pkg, kind))
		case rows[pkg] != "":
			bad = append(bad, fmt.Sprintf("row %s: listed twice", pkg))
		case !strings.HasPrefix(pkg, "internal/") && !strings.HasPrefix(pkg, "cmd/"):
			bad = append(bad, fmt.Sprintf("row %s: not under internal/ or cmd/", pkg))
		default:
			rows[pkg] = kind
		}
	}
	return rows, bad
}

// internalMapViolations applies the map's rules. pkgs are the packages
// under internal/ and cmd/ (relative paths); imports maps each package of
// the module to its non-test imports and deps to its non-test transitive
// dependencies (relative paths of the module only).
func internalMapViolations(rows map[string]string, pkgs []string, imports, deps map[string][]string) []string {
	var out []string
	has := map[string]bool{}
	for _, p := range pkgs {
		has[p] = true
		if rows[p] == "" {
			out = append(out, p+": not on the map of internal/ and cmd/ (add a row to docs/architecture.md)")
		}
	}
	for p := range rows {
		if !has[p] {
			out = append(out, "row "+p+": no such package (remove or rename the row)")
		}
	}
	kindOf := func(p string) string { return rows[p] }
	for p, imps := range imports {
		for _, q := range imps {
			switch k := kindOf(q); {
			case k == kindTestKit && kindOf(p) != kindTestKit:
				out = append(out, fmt.Sprintf("%s imports the test kit %s (only tests and other test kits may)", p, q))
			case k == kindTool && kindOf(p) != kindTool && kindOf(p) != kindToolCmd:
				out = append(out, fmt.Sprintf("%s imports the tool %s (only tools and tool commands may)", p, q))
			}
		}
	}
	for p, ds := range deps {
		if kindOf(p) != kindProduct {
			continue
		}
		for _, q := range ds {
			if k := kindOf(q); k == kindTestKit || k == kindTool || k == kindToolCmd {
				out = append(out, fmt.Sprintf("the product command %s links %s (%s)", p, q, k))
			}
		}
	}
	sort.Strings(out)
	return out
}

func TestInternalMap(t *testing.T) {
	doc, err := os.ReadFile(archDoc)
	if err != nil {
		t.Fatal(err)
	}
	rows, bad := internalMap(string(doc))
	for _, b := range bad {
		t.Error(b)
	}
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}|{{join .Imports " "}}|{{join .Deps " "}}`, mod+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	rel := func(list string) []string {
		var r []string
		for _, p := range strings.Fields(list) {
			if strings.HasPrefix(p, mod+"/") {
				r = append(r, strings.TrimPrefix(p, mod+"/"))
			}
		}
		return r
	}
	var pkgs []string
	imports, deps := map[string][]string{}, map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), "|", 3)
		if len(parts) != 3 {
			continue
		}
		p := strings.TrimPrefix(parts[0], mod+"/")
		if strings.HasPrefix(p, "internal/") || strings.HasPrefix(p, "cmd/") {
			pkgs = append(pkgs, p)
		}
		imports[p], deps[p] = rel(parts[1]), rel(parts[2])
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list returned %d packages under internal/ and cmd/; the check would prove nothing", len(pkgs))
	}
	for _, v := range internalMapViolations(rows, pkgs, imports, deps) {
		t.Errorf("map of internal/ and cmd/ (docs/architecture.md): %s", v)
	}
}

// TestInternalMapCatchesViolations plants one of each fault.
func TestInternalMapCatchesViolations(t *testing.T) {
	doc := "x\n" + internalMapHeader + "\n| --- | --- | --- |\n" +
		"| `cmd/prod` | product command | a |\n| `cmd/tool` | tool command | b |\n| `internal/kit` | test kit | c |\n" +
		"| `internal/lib` | tool | d |\n| `internal/plumb` | plumbing | e |\n| `internal/gone` | plumbing | f |\n" +
		"| `internal/weird` | gadget | g |\n| internal/bare | plumbing | h |\n\nafter\n"
	rows, bad := internalMap(doc)
	wantBad := []string{`row internal/weird: unknown kind "gadget"`, "row \"| internal/bare | plumbing | h |\": the package is not in backticks"}
	if strings.Join(bad, "\n") != strings.Join(wantBad, "\n") {
		t.Errorf("malformed rows:\n%s\nwant\n%s", strings.Join(bad, "\n"), strings.Join(wantBad, "\n"))
	}
	pkgs := []string{"cmd/prod", "cmd/tool", "internal/kit", "internal/lib", "internal/plumb", "internal/new"}
	imports := map[string][]string{
		"internal/plumb": {"internal/kit", "internal/lib"},
		"cmd/tool":       {"internal/lib", "internal/kit"},
	}
	deps := map[string][]string{"cmd/prod": {"internal/plumb", "internal/lib", "internal/kit"}}
	got := internalMapViolations(rows, pkgs, imports, deps)
	want := []string{
		"cmd/tool imports the test kit internal/kit (only tests and other test kits may)",
		"internal/new: not on the map of internal/ and cmd/ (add a row to docs/architecture.md)",
		"internal/plumb imports the test kit internal/kit (only tests and other test kits may)",
		"internal/plumb imports the tool internal/lib (only tools and tool commands may)",
		"row internal/gone: no such package (remove or rename the row)",
		"the product command cmd/prod links internal/kit (test kit)",
		"the product command cmd/prod links internal/lib (tool)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("violations:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
