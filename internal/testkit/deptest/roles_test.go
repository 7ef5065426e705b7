package deptest

import (
	"bufio"
	"bytes"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// roleForbidden lists, per command, the packages it must not link: each
// role wires only itself (internal/setup/{agentsetup,relaysetup}). An entry
// ending in "/" forbids every package under that path; any other names one
// package exactly.
var roleForbidden = map[string][]string{
	"cmd/forgeyard-agent": {"modernc.org/sqlite/", "github.com/jackc/pgx/", "github.com/minio/minio-go/v7/",
		mod + "/semantics/daemon", mod + "/semantics/authority"},
	"cmd/forgeyard-relay": {"modernc.org/sqlite/", "github.com/jackc/pgx/", "github.com/minio/minio-go/v7/",
		mod + "/semantics/daemon", mod + "/semantics/agent", mod + "/semantics/authority"},
	// The signing worker is an agent endpoint with keys: no database, no
	// daemon, no authority, no device agent.
	"cmd/forgeyard-signer": {"modernc.org/sqlite/", "github.com/jackc/pgx/",
		mod + "/semantics/daemon", mod + "/semantics/authority", mod + "/semantics/deviceagent"},
}

func forbidden(pkg string, rules []string) bool {
	for _, r := range rules {
		if strings.HasSuffix(r, "/") {
			if pkg+"/" == r || strings.HasPrefix(pkg, r) {
				return true
			}
		} else if pkg == r {
			return true
		}
	}
	return false
}

// chains returns, for every forbidden package reachable from root in
// graph (package → its imports), the shortest import chain to it,
// "root → a → b → forbidden", in breadth-first order.
func chains(graph map[string][]string, root string, rules []string) []string {
	parent := map[string]string{root: ""}
	queue := []string{root}
	var out []string
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if forbidden(p, rules) {
			chain := []string{p}
			for q := parent[p]; q != ""; q = parent[q] {
				chain = append([]string{q}, chain...)
			}
			out = append(out, strings.Join(chain, " → "))
			continue // its own imports are its problem, not another violation
		}
		for _, imp := range graph[p] {
			if _, seen := parent[imp]; !seen {
				parent[imp] = p
				queue = append(queue, imp)
			}
		}
	}
	return out
}

// TestRoleDeps checks that forgeyard-agent links neither a database driver
// nor the daemon or the authority, forgeyard-relay neither a database
// driver, nor the authority, nor either engine, and forgeyard-signer
// neither a database driver, nor the daemon, the authority or the device
// agent.
func TestRoleDeps(t *testing.T) {
	for _, cmdDir := range slices.Sorted(maps.Keys(roleForbidden)) {
		rules := roleForbidden[cmdDir]
		root := mod + "/" + cmdDir
		cmd := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}} {{join .Imports " "}}`, root)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", root, err, stderr.String())
		}
		graph := map[string][]string{}
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) > 0 {
				graph[f[0]] = f[1:]
			}
		}
		if _, ok := graph[root]; !ok || len(graph) < 10 {
			t.Fatalf("go list -deps %s returned %d packages, not the command; the check would prove nothing", root, len(graph))
		}
		for _, c := range chains(graph, root, rules) {
			t.Errorf("%s must not link this (each role wires only itself, internal/setup): %s", cmdDir, c)
		}
	}
}

// TestRoleDepsCatchesChains proves the chain search is not vacuous.
func TestRoleDepsCatchesChains(t *testing.T) {
	graph := map[string][]string{
		"cmd":                     {"setup", "fmt"},
		"setup":                   {"mid", "modernc.org/sqlite"},
		"mid":                     {mod + "/semantics/daemon"},
		"fmt":                     {},
		mod + "/semantics/daemon": {mod + "/semantics/authority"},
		"modernc.org/sqlite":      {"modernc.org/sqlite/lib"},
	}
	rules := roleForbidden["cmd/forgeyard-agent"]
	got := chains(graph, "cmd", rules)
	want := []string{"cmd → setup → modernc.org/sqlite", "cmd → setup → mid → " + mod + "/semantics/daemon"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("chains:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if forbidden(mod+"/semantics/agent", rules) || forbidden(mod+"/semantics/daemonx", rules) || !forbidden("github.com/jackc/pgx/v5", rules) {
		t.Error("forbidden matches the wrong packages")
	}
}
