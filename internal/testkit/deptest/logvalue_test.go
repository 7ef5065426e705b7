package deptest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestEnumsHaveLogValue: every type of wire/... and semantics/... with a
// String method (enums, versions, codes, digests) also has a LogValue
// method, so slog's JSON handler logs its name ("1.2", "Accepted",
// "Overloaded") instead of a number or a struct ({"Major":1,"Minor":2}).
// The text handler already used String; JSON did not.
func TestEnumsHaveLogValue(t *testing.T) {
	type key struct{ dir, typ string }
	stringers := map[key]string{} // → position
	logValuers := map[key]bool{}
	// Types whose String is not their log form: secrets log as redacted by
	// their own LogValue; generated protobuf code is not ours.
	skipDirs := []string{filepath.Join("wire", "internal", "codecbench")}
	for _, root := range []string{"wire", "semantics"} {
		err := filepath.WalkDir(filepath.Join("..", "..", "..", root), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			for _, s := range skipDirs {
				if strings.Contains(path, s) {
					return nil
				}
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			dir := filepath.Dir(path)
			for _, decl := range f.Decls {
				fd, ok := decl.(*ast.FuncDecl)
				if !ok || fd.Recv == nil || len(fd.Recv.List) != 1 {
					continue
				}
				rt := fd.Recv.List[0].Type
				if _, ptr := rt.(*ast.StarExpr); ptr {
					continue // pointer receivers: messages, not values
				}
				id, ok := rt.(*ast.Ident)
				if !ok {
					continue
				}
				k := key{dir, id.Name}
				switch fd.Name.Name {
				case "String":
					if fd.Type.Params.NumFields() == 0 {
						stringers[k] = path
					}
				case "LogValue":
					logValuers[k] = true
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(stringers) < 20 {
		t.Fatalf("found only %d String methods; the walk is broken", len(stringers))
	}
	var missing []string
	for k, pos := range stringers {
		if !logValuers[k] {
			missing = append(missing, k.typ+" ("+pos+")")
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("%s has String but no LogValue: add func (x T) LogValue() slog.Value { return slog.StringValue(x.String()) }", m)
	}
}
