package deptest

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// apiDoc is the one list of the packages under the stability promise: the
// rows of its tables whose second column is "stable".
const apiDoc = "../../../docs/api.md"

// stablePackages reads the package paths (relative to the module root) out of
// docs/api.md: every table row of the form "| `path` | stable | …".
func stablePackages(t *testing.T) []string {
	t.Helper()
	f, err := os.Open(apiDoc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var pkgs []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		cols := strings.Split(sc.Text(), "|")
		if len(cols) < 4 || strings.TrimSpace(cols[0]) != "" {
			continue
		}
		path := strings.TrimSpace(cols[1])
		if strings.TrimSpace(cols[2]) != "stable" || !strings.HasPrefix(path, "`") || !strings.HasSuffix(path, "`") {
			continue
		}
		pkgs = append(pkgs, strings.Trim(path, "`"))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(pkgs) == 0 {
		t.Fatalf("%s lists no stable package (rows \"| `path` | stable | … |\")", apiDoc)
	}
	return pkgs
}

// TestAPIDocumented fails when an exported identifier of a package that
// docs/api.md lists as stable has no doc comment: a type, a function, a
// method of an exported type, an exported constant or variable (for a
// parenthesised const or var block a comment on the block is enough, as
// golint accepts). Test files are not part of the API and are not read.
func TestAPIDocumented(t *testing.T) {
	var missing []string
	for _, pkg := range stablePackages(t) {
		dir := filepath.Join("..", "..", "..", filepath.FromSlash(pkg))
		missing = append(missing, undocumented(t, dir, pkg)...)
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		t.Errorf("%d exported identifiers of the stable packages (%s) have no doc comment:\n\t%s",
			len(missing), apiDoc, strings.Join(missing, "\n\t"))
	}
}

func undocumented(t *testing.T, dir, pkg string) []string {
	t.Helper()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("package %s listed in %s: %v", pkg, apiDoc, err)
	}
	var missing []string
	report := func(pos token.Pos, what string) {
		p := fset.Position(pos)
		missing = append(missing, pkg+"."+what+" ("+filepath.Base(p.Filename)+":"+strconv.Itoa(p.Line)+")")
	}
	files := 0
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if f.Name.Name == "main" || strings.HasSuffix(f.Name.Name, "_test") {
			continue
		}
		files++
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() || d.Doc != nil {
					continue
				}
				if d.Recv == nil {
					report(d.Pos(), d.Name.Name)
					continue
				}
				if recv := recvName(d.Recv.List[0].Type); ast.IsExported(recv) {
					report(d.Pos(), recv+"."+d.Name.Name)
				}
			case *ast.GenDecl:
				grouped := d.Lparen.IsValid()
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() && s.Doc == nil && (grouped || d.Doc == nil) {
							report(s.Pos(), s.Name.Name)
						}
					case *ast.ValueSpec:
						if s.Doc != nil || d.Doc != nil {
							continue
						}
						for _, n := range s.Names {
							if n.IsExported() {
								report(n.Pos(), n.Name)
							}
						}
					}
				}
			}
		}
	}
	if files == 0 {
		t.Errorf("package %s listed in %s has no Go files in %s", pkg, apiDoc, dir)
	}
	return missing
}

// recvName is the type name of a method receiver: T, *T, T[P], *T[P].
func recvName(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}
