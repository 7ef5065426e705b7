package deptest

import (
	"bufio"
	"bytes"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

// The map of semantics/ is a table in the package doc comment of
// semantics/doc.go, a Go doc code block of Markdown table lines:
//
//	| package | kind | may import | used by |
//	| --- | --- | --- | --- |
//	| `semantics/cas` | data path | `wire/...`, contract, `semantics/objstore` | engines |
//
// One row per package under semantics/; "package" is a backticked path
// relative to the module; "kind" one of mapKinds; "may import" a
// comma-separated list of kinds (every package of that kind), backticked
// packages (`p/...` is p and everything under it) or "—" for nothing of the
// module; "used by" is free text. docs/architecture.md carries the same
// lines.
const (
	semanticsDoc = "../../../semantics/doc.go"
	archDoc      = "../../../docs/architecture.md"
	mapHeader    = "| package | kind | may import | used by |"
)

var mapKinds = map[string]bool{
	"contract": true, "identity": true, "telemetry": true, "helper": true,
	"store": true, "data path": true, "engine": true, "test kit": true,
}

type mapRow struct {
	pkg, kind string   // pkg relative to the module
	may       []string // kinds, or packages as "`semantics/objstore`" / "`wire/...`"
}

// mapTable returns the lines (trimmed) of the first table in text whose
// header is mapHeader, header and separator included.
func mapTable(text string) []string { return mapTableWith(text, mapHeader) }

// mapTableWith returns the lines (trimmed) of the first table in text
// headed header, header and separator included.
func mapTableWith(text, header string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case out == nil && l == header:
			out = append(out, l)
		case out != nil && strings.HasPrefix(l, "|"):
			out = append(out, l)
		case out != nil:
			return out
		}
	}
	return out
}

// parseMap parses the table lines of mapTable into rows, naming the first
// malformed line.
func parseMap(lines []string) ([]mapRow, error) {
	if len(lines) < 3 || lines[1] != "| --- | --- | --- | --- |" {
		return nil, fmt.Errorf("want the header %q, a separator and at least one row, got %d lines", mapHeader, len(lines))
	}
	var rows []mapRow
	seen := map[string]bool{}
	for _, l := range lines[2:] {
		cells := strings.Split(strings.Trim(l, "|"), "|")
		if len(cells) != 4 {
			return nil, fmt.Errorf("row %q: want 4 cells, got %d", l, len(cells))
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		pkg, ok := backticked(cells[0])
		if !ok || !(pkg == "semantics" || strings.HasPrefix(pkg, "semantics/")) {
			return nil, fmt.Errorf("row %q: package %q is not a backticked path under semantics/", l, cells[0])
		}
		if seen[pkg] {
			return nil, fmt.Errorf("row %q: %s has a row already", l, pkg)
		}
		seen[pkg] = true
		if !mapKinds[cells[1]] {
			return nil, fmt.Errorf("row %q: unknown kind %q", l, cells[1])
		}
		r := mapRow{pkg: pkg, kind: cells[1]}
		if cells[2] != "—" {
			for _, t := range strings.Split(cells[2], ",") {
				t = strings.TrimSpace(t)
				if _, ok := backticked(t); !ok && !mapKinds[t] {
					return nil, fmt.Errorf("row %q: may-import term %q is neither a kind nor a backticked package", l, t)
				}
				r.may = append(r.may, t)
			}
		}
		rows = append(rows, r)
	}
	return rows, nil
}

func backticked(s string) (string, bool) {
	if len(s) > 2 && s[0] == '`' && s[len(s)-1] == '`' && !strings.ContainsAny(s[1:len(s)-1], "` ") {
		return s[1 : len(s)-1], true
	}
	return "", false
}

// mapAllows says whether row r of rows may import imp (a full import path
// inside the module).
func mapAllows(rows []mapRow, r mapRow, imp string) bool {
	for _, t := range r.may {
		if p, ok := backticked(t); ok {
			if base, sub := strings.CutSuffix(p, "/..."); sub {
				if under(imp, base) {
					return true
				}
			} else if imp == mod+"/"+p {
				return true
			}
			continue
		}
		for _, o := range rows {
			if o.kind == t && imp == mod+"/"+o.pkg {
				return true
			}
		}
	}
	return false
}

// mapViolations checks the map against the packages under semantics/ and
// their non-test imports (full paths): a package without a row, a row
// without a package, an import of the module its row does not allow.
func mapViolations(rows []mapRow, imports map[string][]string) []string {
	var out []string
	byPkg := map[string]mapRow{}
	for _, r := range rows {
		byPkg[mod+"/"+r.pkg] = r
		if _, ok := imports[mod+"/"+r.pkg]; !ok {
			out = append(out, fmt.Sprintf("row %s: no such package under semantics/ (remove the row from semantics/doc.go and docs/architecture.md)", r.pkg))
		}
	}
	var pkgs []string
	for p := range imports {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	for _, p := range pkgs {
		r, ok := byPkg[p]
		if !ok {
			out = append(out, fmt.Sprintf("%s: not on the map (add a row to semantics/doc.go and docs/architecture.md)", p))
			continue
		}
		for _, imp := range imports[p] {
			if imp == mod || !strings.HasPrefix(imp, mod+"/") {
				continue
			}
			if !mapAllows(rows, r, imp) {
				may := strings.Join(r.may, ", ")
				if may == "" {
					may = "—"
				}
				out = append(out, fmt.Sprintf("%s (%s) imports %s: its row allows only %s", p, r.kind, imp, may))
			}
		}
	}
	return out
}

// docMap reads the map out of semantics/doc.go's package doc comment.
func docMap(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), semanticsDoc, nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	if f.Doc == nil {
		t.Fatalf("%s has no package doc comment", semanticsDoc)
	}
	lines := mapTable(f.Doc.Text())
	if lines == nil {
		t.Fatalf("%s: the package doc comment holds no table with the header %q", semanticsDoc, mapHeader)
	}
	return lines
}

// TestSemanticsMap: the map of semantics/ in semantics/doc.go names every
// package under semantics/ and nothing else, each package's non-test imports
// of the module obey its "may import" cell, and docs/architecture.md
// carries the same table, line for line.
func TestSemanticsMap(t *testing.T) {
	lines := docMap(t)
	rows, err := parseMap(lines)
	if err != nil {
		t.Fatalf("%s, the map of semantics/: %v", semanticsDoc, err)
	}

	arch, err := os.ReadFile(archDoc)
	if err != nil {
		t.Fatal(err)
	}
	if md := mapTable(string(arch)); strings.Join(md, "\n") != strings.Join(lines, "\n") {
		for i := 0; i < len(md) || i < len(lines); i++ {
			var a, b string
			if i < len(lines) {
				a = lines[i]
			}
			if i < len(md) {
				b = md[i]
			}
			if a != b {
				t.Errorf("the map drifted: line %d of the table is\n  semantics/doc.go:     %q\n  docs/architecture.md: %q", i+1, a, b)
			}
		}
	}

	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}|{{join .Imports " "}}`, mod+"/semantics/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	imports := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		p, imps, ok := strings.Cut(sc.Text(), "|")
		if ok {
			imports[p] = strings.Fields(imps)
		}
	}
	if len(imports) < 10 {
		t.Fatalf("go list returned only %d packages under semantics/; the check would prove nothing", len(imports))
	}
	for _, v := range mapViolations(rows, imports) {
		t.Errorf("map of semantics/ (semantics/doc.go): %s", v)
	}
}

// TestSemanticsMapCatchesViolations proves the map's rules are not vacuous:
// a planted table and import graph with one of each fault is caught.
func TestSemanticsMapCatchesViolations(t *testing.T) {
	lines := mapTable("intro\n\n\t" + mapHeader + "\n\t| --- | --- | --- | --- |\n" +
		"\t| `semantics` | contract | `wire/...` | all |\n" +
		"\t| `semantics/cas` | data path | `wire/...`, contract | engines |\n" +
		"\t| `semantics/gone` | store | — | nobody |\n" +
		"\t| `semantics/daemon` | engine | contract, data path | cmd |\n\nafter\n")
	rows, err := parseMap(lines)
	if err != nil {
		t.Fatal(err)
	}
	got := mapViolations(rows, map[string][]string{
		mod + "/semantics":        {"fmt", mod + "/wire"},
		mod + "/semantics/cas":    {mod + "/wire/cas", mod + "/semantics", mod + "/semantics/daemon"},
		mod + "/semantics/daemon": {mod + "/semantics/cas", mod + "/internal/x"},
		mod + "/semantics/new":    {},
	})
	want := []string{
		"row semantics/gone: no such package under semantics/ (remove the row from semantics/doc.go and docs/architecture.md)",
		mod + "/semantics/cas (data path) imports " + mod + "/semantics/daemon: its row allows only `wire/...`, contract",
		mod + "/semantics/daemon (engine) imports " + mod + "/internal/x: its row allows only contract, data path",
		mod + "/semantics/new: not on the map (add a row to semantics/doc.go and docs/architecture.md)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("planted map: got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, bad := range []string{
		"| `semantics/x` | room | — | a |",              // unknown kind
		"| semantics/x | store | — | a |",               // package not backticked
		"| `wire/x` | store | — | a |",                  // not under semantics/
		"| `semantics/x` | store | anything | a |",      // unknown may-import term
		"| `semantics/x` | store | — |",                 // three cells
		"| `semantics` | contract | `wire/...` | all |", // a second row for semantics
	} {
		if _, err := parseMap([]string{mapHeader, "| --- | --- | --- | --- |", "| `semantics` | contract | `wire/...` | all |", bad}); err == nil {
			t.Errorf("parseMap accepts %q", bad)
		}
	}
}
