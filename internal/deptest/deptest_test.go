package deptest

import (
	"bufio"
	"bytes"
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
		case under(pkg, "wire") && under(imp, "semantics", "backends", "relay", "cmd", "matrix"):
			out = append(out, pkg+" imports "+imp)
		case !test && under(pkg, "semantics") && under(imp, "backends", "relay", "cmd", "matrix"):
			out = append(out, pkg+" imports "+imp)
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
		{mod + "/backends/yamux", "github.com/quic-go/quic-go", false, true},
		{mod + "/backends/quic", "github.com/quic-go/quic-go", false, false},
		{mod + "/backends/webtransport", "github.com/quic-go/webtransport-go", false, false},
		{mod + "/relay", "github.com/hashicorp/yamux", false, true},
		{mod + "/backends/yamux", "github.com/hashicorp/yamux", false, false},
		{mod + "/semantics", mod + "/wire", false, false},
	}
	for _, c := range cases {
		got := len(violations(c.pkg, []string{c.imp}, c.test)) > 0
		if got != c.bad {
			t.Errorf("%s importing %s (test=%v): violation=%v, want %v", c.pkg, c.imp, c.test, got, c.bad)
		}
	}
}
