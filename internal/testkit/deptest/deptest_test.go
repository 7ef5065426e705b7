package deptest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

const mod = "forgeyard.dev/transport"

func under(pkg string, dirs ...string) bool {
	for _, d := range dirs {
		p := mod + "/" + d
		if pkg == p || strings.HasPrefix(pkg, p+"/") {
			return true
		}
	}
	return false
}

// violations applies the layering rule to one package's imports. test says
// whether imports come from test files, where semantics may use backends
// (e.g. the memory backend) but nothing may pull quic-go or yamux outside
// their backends.
func violations(pkg string, imports []string, test bool) []string {
	var out []string
	for _, imp := range imports {
		switch {
		case (strings.HasPrefix(imp, "github.com/quic-go/quic-go") || strings.HasPrefix(imp, "github.com/quic-go/webtransport-go")) &&
			!under(pkg, "backends/quic", "backends/webtransport"):
			out = append(out, pkg+" imports "+imp)
		case strings.HasPrefix(imp, "github.com/hashicorp/yamux") && !under(pkg, "backends/yamux"):
			out = append(out, pkg+" imports "+imp)
		case strings.HasPrefix(imp, "github.com/minio/minio-go") && !under(pkg, "semantics/objstore/s3store"):
			out = append(out, pkg+" imports "+imp)
		case under(pkg, "wire") && under(imp, "semantics", "backends", "relay", "cmd", "matrix"):
			out = append(out, pkg+" imports "+imp)
		case !test && under(pkg, "semantics") && under(imp, "backends", "relay", "cmd", "matrix"):
			out = append(out, pkg+" imports "+imp)
		case !test && under(pkg, "semantics") && under(imp, "internal"):
			// semantics/internal/... is semantics' own; the module's
			// internal/ (product plumbing, test kits, tools) sits above it.
			out = append(out, pkg+" imports "+imp+" (semantics imports nothing of internal/)")
		}
	}
	return out
}

func TestLayering(t *testing.T) {
	cmd := exec.Command("go", "list", "-f",
		`{{.ImportPath}}|{{join .Imports " "}}|{{join .TestImports " "}} {{join .XTestImports " "}}`, mod+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var bad []string
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), "|", 3)
		if len(parts) != 3 {
			continue
		}
		n++
		bad = append(bad, violations(parts[0], strings.Fields(parts[1]), false)...)
		bad = append(bad, violations(parts[0], strings.Fields(parts[2]), true)...)
	}
	if n < 3 {
		t.Fatalf("go list returned only %d packages; the check would prove nothing", n)
	}
	for _, b := range bad {
		t.Errorf("layering violation (ARCHITECTURE.md): %s", b)
	}
}

// TestRuleCatchesViolations proves the rule is not vacuous.
func TestRuleCatchesViolations(t *testing.T) {
	cases := []struct {
		pkg, imp string
		test     bool
		bad      bool
	}{
		{mod + "/wire", mod + "/semantics", false, true},
		{mod + "/wire/agent", mod + "/backends/quic", true, true},
		{mod + "/semantics", mod + "/backends/memory", false, true},
		{mod + "/semantics", mod + "/backends/memory", true, false},
		{mod + "/semantics/control", "github.com/quic-go/quic-go", true, true},
		{mod + "/semantics/cas", "github.com/minio/minio-go/v7", false, true},
		{mod + "/semantics/objstore/s3store", "github.com/minio/minio-go/v7", false, false},
		{mod + "/backends/yamux", "github.com/quic-go/quic-go", false, true},
		{mod + "/backends/quic", "github.com/quic-go/quic-go", false, false},
		{mod + "/backends/webtransport", "github.com/quic-go/webtransport-go", false, false},
		{mod + "/relay", "github.com/hashicorp/yamux", false, true},
		{mod + "/backends/yamux", "github.com/hashicorp/yamux", false, false},
		{mod + "/semantics", mod + "/wire", false, false},
		{mod + "/semantics/logs", mod + "/internal/atomicfile", false, true},
		{mod + "/semantics/telemetry", mod + "/internal/stats", false, true},
		{mod + "/semantics/telemetry", mod + "/internal/stats", true, false},
		{mod + "/semantics/cas", mod + "/semantics/internal/atomicfile", false, false},
		{mod + "/cmd/forgeyard-agent", mod + "/internal/stats", false, false},
	}
	for _, c := range cases {
		got := len(violations(c.pkg, []string{c.imp}, c.test)) > 0
		if got != c.bad {
			t.Errorf("%s importing %s (test=%v): violation=%v, want %v", c.pkg, c.imp, c.test, got, c.bad)
		}
	}
}

// The transport contract (semantics, semantics/session, semantics/control)
// stays small and pure: it imports only wire, the standard library,
// golang.org/x and itself. Metrics reach it through semantics.Observer, which
// semantics/telemetry implements, never the reverse.
var contract = []string{"semantics", "semantics/session", "semantics/control"}

func isContract(pkg string) bool {
	for _, c := range contract {
		if pkg == mod+"/"+c {
			return true
		}
	}
	return false
}

// forbiddenDep says why pkg must not be linked into the contract or a
// backend, or returns "".
func forbiddenDep(pkg string) string {
	prefixes := []struct{ prefix, why string }{
		{"github.com/prometheus/", "metrics library"},
		{"go.opentelemetry.io/otel/sdk", "tracing SDK"},
		{"modernc.org/sqlite", "SQL driver"},
		{"github.com/mattn/go-sqlite3", "SQL driver"},
		{"github.com/jackc/pgx", "SQL driver"},
		{"github.com/lib/pq", "SQL driver"},
		{"github.com/minio/minio-go", "object store SDK"},
	}
	for _, p := range prefixes {
		base := strings.TrimSuffix(p.prefix, "/")
		if pkg == base || strings.HasPrefix(pkg, base+"/") {
			return p.why
		}
	}
	switch {
	case under(pkg, "semantics/telemetry"):
		return "telemetry implementation (use semantics.Observer)"
	case under(pkg, "semantics/daemon", "semantics/agent", "semantics/authority", "relay", "cmd"):
		return "engine"
	}
	return ""
}

type listed struct {
	ImportPath string
	Standard   bool
	DepOnly    bool
	Imports    []string
}

// contractViolations walks the import graph from each root and reports,
// with the import chain from the root, every forbidden dependency and every
// import of a contract package outside wire, the standard library,
// golang.org/x and the contract.
func contractViolations(roots []string, graph map[string]*listed) []string {
	var out []string
	seen := map[string]bool{}
	report := func(msg string) {
		if !seen[msg] {
			seen[msg] = true
			out = append(out, msg)
		}
	}
	for _, root := range roots {
		parent := map[string]string{root: ""}
		chain := func(p string) string {
			var c []string
			for ; p != ""; p = parent[p] {
				c = append(c, p)
			}
			for i, j := 0, len(c)-1; i < j; i, j = i+1, j-1 {
				c[i], c[j] = c[j], c[i]
			}
			return strings.Join(c, " → ")
		}
		queue := []string{root}
		for len(queue) > 0 {
			p := queue[0]
			queue = queue[1:]
			if why := forbiddenDep(p); why != "" {
				report(fmt.Sprintf("%s (%s)", chain(p), why))
				continue // its own imports are not the root's concern
			}
			lp := graph[p]
			if lp == nil {
				continue
			}
			for _, imp := range lp.Imports {
				if isContract(p) {
					std := graph[imp] != nil && graph[imp].Standard
					if !std && !under(imp, "wire") && !isContract(imp) && !strings.HasPrefix(imp, "golang.org/x/") {
						report(fmt.Sprintf("%s → %s (the contract imports only wire, the standard library and golang.org/x)", chain(p), imp))
					}
				}
				if _, ok := parent[imp]; !ok {
					parent[imp] = p
					queue = append(queue, imp)
				}
			}
		}
	}
	return out
}

// TestContractDeps: neither the contract packages nor any backend
// (backends/... without tests, as a program links them) depend on
// Prometheus, the OpenTelemetry SDK, semantics/telemetry, an SQL driver or
// an engine, and the contract imports only wire, the standard library and
// golang.org/x. A failure lists the import chain from the root.
func TestContractDeps(t *testing.T) {
	// The rule is not vacuous: a planted graph is caught, with its chains.
	planted := map[string]*listed{
		mod + "/semantics":         {Imports: []string{"fmt", mod + "/wire"}},
		mod + "/semantics/session": {Imports: []string{mod + "/wire", "github.com/BurntSushi/toml"}},
		mod + "/semantics/control": {Imports: []string{mod + "/semantics", mod + "/semantics/session"}},
		mod + "/backends/memory":   {Imports: []string{mod + "/semantics", mod + "/x"}},
		mod + "/x":                 {Imports: []string{"github.com/prometheus/client_golang/prometheus"}},
		mod + "/wire":              {},
		"fmt":                      {Standard: true},
	}
	got := contractViolations([]string{mod + "/semantics/control", mod + "/backends/memory"}, planted)
	want := []string{
		mod + "/semantics/control → " + mod + "/semantics/session → github.com/BurntSushi/toml (the contract imports only wire, the standard library and golang.org/x)",
		mod + "/backends/memory → " + mod + "/x → github.com/prometheus/client_golang/prometheus (metrics library)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("planted graph: got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, p := range []string{"go.opentelemetry.io/otel/sdk/trace", "modernc.org/sqlite", "github.com/jackc/pgx/v5/stdlib",
		mod + "/semantics/telemetry", mod + "/semantics/daemon", mod + "/semantics/agent/x", mod + "/semantics/authority", mod + "/relay"} {
		if forbiddenDep(p) == "" {
			t.Errorf("forbiddenDep(%s) allows it", p)
		}
	}
	for _, p := range []string{"go.opentelemetry.io/otel/trace", mod + "/semantics/trust", "database/sql/driver", mod + "/wire"} {
		if why := forbiddenDep(p); why != "" {
			t.Errorf("forbiddenDep(%s) = %q", p, why)
		}
	}

	args := []string{"list", "-deps", "-json=ImportPath,Standard,DepOnly,Imports"}
	for _, c := range contract {
		args = append(args, mod+"/"+c)
	}
	args = append(args, mod+"/backends/...")
	cmd := exec.Command("go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	graph := map[string]*listed{}
	var roots []string
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p listed
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		graph[p.ImportPath] = &p
		if !p.DepOnly {
			roots = append(roots, p.ImportPath)
		}
	}
	var backends int
	for _, r := range roots {
		if under(r, "backends") {
			backends++
		}
	}
	if len(roots) != len(contract)+backends || backends < 5 {
		t.Fatalf("go list returned roots %v; want the %d contract packages and at least the 5 backend packages", roots, len(contract))
	}
	for _, v := range contractViolations(roots, graph) {
		t.Errorf("contract dependency violation: %s", v)
	}
}
