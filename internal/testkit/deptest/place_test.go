package deptest

import (
	"os"
	"sort"
	"strings"
	"testing"
)

// placeOf is where each kind of the map of internal/ and cmd/ lives, so a
// package's folder says what it is (issue 28 item 4): product plumbing
// directly under internal/, test kits under internal/testkit/, tools and
// their commands under internal/tools/ (a tool command may also be a
// cmd/).
var placeOf = map[string][]string{
	kindProduct:  {"cmd/"},
	kindToolCmd:  {"cmd/", "internal/tools/"},
	kindPlumbing: {"internal/"},
	kindTool:     {"internal/tools/"},
	kindTestKit:  {"internal/testkit/"},
}

// internalPlaceViolations lists the rows whose package is not where its
// kind lives.
func internalPlaceViolations(rows map[string]string) []string {
	var out []string
	for p, k := range rows {
		ok := false
		for _, prefix := range placeOf[k] {
			if strings.HasPrefix(p, prefix) {
				ok = true
			}
		}
		if k == kindPlumbing && (strings.HasPrefix(p, "internal/testkit/") || strings.HasPrefix(p, "internal/tools/")) {
			ok = false
		}
		if !ok {
			where := strings.Join(placeOf[k], " or ")
			if k == kindPlumbing {
				where += " (outside internal/testkit/ and internal/tools/)"
			}
			out = append(out, p+" ("+k+") is not under "+where)
		}
	}
	sort.Strings(out)
	return out
}

func TestInternalPlaces(t *testing.T) {
	doc, err := os.ReadFile(archDoc)
	if err != nil {
		t.Fatal(err)
	}
	rows, _ := internalMap(string(doc))
	for _, v := range internalPlaceViolations(rows) {
		t.Error(v)
	}
}

func TestInternalPlacesCatchViolations(t *testing.T) {
	rows := map[string]string{
		"internal/testkit/kit": kindTestKit, "internal/kit": kindTestKit,
		"internal/tools/lib": kindTool, "internal/lib": kindTool,
		"internal/plumb": kindPlumbing, "internal/tools/plumb": kindPlumbing,
		"cmd/prod": kindProduct, "internal/prod": kindProduct,
		"internal/tools/x/cmd/x": kindToolCmd, "cmd/tool": kindToolCmd, "internal/testkit/cmd": kindToolCmd,
	}
	want := []string{
		"internal/kit (test kit) is not under internal/testkit/",
		"internal/lib (tool) is not under internal/tools/",
		"internal/prod (product command) is not under cmd/",
		"internal/testkit/cmd (tool command) is not under cmd/ or internal/tools/",
		"internal/tools/plumb (plumbing) is not under internal/ (outside internal/testkit/ and internal/tools/)",
	}
	if got := internalPlaceViolations(rows); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("violations:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
