package matrix

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// TestCompatibilityDocCurrent keeps docs/compatibility.md and
// matrix/results.json honest: the results must be a full run covering
// every cell the manifest declares, each recorded with the expectation the
// manifest implies now and passing; and the doc's table must be exactly
// what the manifest and those results render. Any manifest change without
// a new `make matrix` fails here.
func TestCompatibilityDocCurrent(t *testing.T) {
	const hint = "run `make matrix` and commit matrix/results.json and docs/compatibility.md"
	m, err := LoadManifest("manifest.json")
	if err != nil {
		t.Fatal(err)
	}
	res, err := LoadResults("results.json")
	if err != nil {
		t.Fatalf("%v (%s)", err, hint)
	}
	if !res.Full {
		t.Errorf("results.json is not from a full run (%s)", hint)
	}
	var want []string
	for _, p := range AllPairs(m) {
		d, _ := m.Release(p[0])
		a, _ := m.Release(p[1])
		exp, err := Expect(d, a)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range m.Backends {
			key := p[0] + "/" + p[1] + "/" + b.Name
			want = append(want, key)
			i := slices.IndexFunc(res.Cells, func(c Cell) bool { return c.Daemon == p[0] && c.Agent == p[1] && c.Backend == b.Name })
			if i < 0 {
				t.Errorf("cell %s missing from results.json (%s)", key, hint)
				continue
			}
			c := res.Cells[i]
			if want := CellPending(d, a, b); c.Pending != want {
				t.Errorf("cell %s: pending %q in results, %q by the manifest (%s)", key, c.Pending, want, hint)
			}
			if c.Pending != "" {
				continue
			}
			if c.Expected.String() != exp.String() {
				t.Errorf("cell %s: results expected %v, the manifest now implies %v (%s)", key, c.Expected, exp, hint)
			}
			if !c.Pass {
				t.Errorf("cell %s failed in the committed run: %s", key, summary(&c))
			}
		}
	}
	if len(res.Cells) != len(want) {
		t.Errorf("results.json has %d cells, the manifest declares %d (%s)", len(res.Cells), len(want), hint)
	}
	doc, err := os.ReadFile("../docs/compatibility.md")
	if err != nil {
		t.Fatal(err)
	}
	got, err := DocTable(doc)
	if err != nil {
		t.Fatal(err)
	}
	if rendered := strings.TrimSpace(Markdown(m, res)); got != rendered {
		t.Errorf("docs/compatibility.md's table is stale (%s); it should read:\n%s", hint, rendered)
	}
}
