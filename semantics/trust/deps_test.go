package trust_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImports pins the layering rule: semantics/trust (and trusttest)
// import only the standard library, wire and the ULID package that wire's
// identifiers are built on; never a backend.
func TestImports(t *testing.T) {
	allowed := func(p string) bool {
		first, _, _ := strings.Cut(p, "/")
		if !strings.Contains(first, ".") {
			return true // standard library
		}
		return p == "forgeyard.dev/transport/wire" || strings.HasPrefix(p, "forgeyard.dev/transport/wire/") ||
			p == "forgeyard.dev/transport/semantics/trust" || p == "github.com/oklog/ulid/v2" ||
			// the module's one atomic writer, and the library it wraps
			p == "forgeyard.dev/transport/semantics/internal/atomicfile" || p == "github.com/google/renameio/v2"
	}
	for _, dir := range []string{".", "trusttest"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: %v (%d files)", dir, err, len(files))
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range af.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if !allowed(p) {
					t.Errorf("%s imports %s", f, p)
				}
			}
		}
	}
}
