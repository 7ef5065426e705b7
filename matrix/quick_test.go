package matrix

import (
	"context"
	"slices"
	"testing"
	"time"
)

// quickPairs are the (daemon, agent) pairs of the quick matrix: the
// current tree against itself, against the previous release and against
// the newest release of an older protocol range (when that is another
// one), in both directions, plus the current daemon with every agent test
// peer and every daemon test peer with the oldest of those releases.
func quickPairs(m *Manifest) ([][2]string, error) {
	var prev []string
	var head Release
	for _, r := range m.Releases {
		if r.Tag == HEAD {
			head = r
		}
	}
	for i := len(m.Releases) - 1; i >= 0; i-- {
		r := m.Releases[i]
		if r.Tag == HEAD {
			continue
		}
		if len(prev) == 0 || (r.Protocol != head.Protocol && !slices.ContainsFunc(prev, func(n string) bool {
			p, _ := m.Release(n)
			return p.Protocol != head.Protocol
		})) {
			prev = append(prev, r.Name)
		}
	}
	pairs := [][2]string{{head.Name, head.Name}}
	for _, p := range prev {
		pairs = append(pairs, [2]string{head.Name, p}, [2]string{p, head.Name})
	}
	for _, p := range m.Peers {
		if p.Role == "daemon" { // with the agent of the oldest protocol selected
			if len(prev) == 0 {
				continue
			}
			pairs = append(pairs, [2]string{p.Name, prev[len(prev)-1]})
			continue
		}
		pairs = append(pairs, [2]string{head.Name, p.Name})
	}
	return pairs, nil
}

// TestQuickMatrix runs the quick subset of the compatibility matrix inside
// `make test`: every backend, the current tree against the previous
// release(s) in both directions and against itself, the core scenarios,
// and the rejection of every test peer. Old releases are built from their
// git tags (cached by commit). It fails when any cell differs from what
// the manifest promises.
func TestQuickMatrix(t *testing.T) {
	if testing.Short() {
		t.Skip("the quick matrix builds releases and runs processes; run without -short (make test)")
	}
	m, err := LoadManifest("manifest.json")
	if err != nil {
		t.Fatal(err)
	}
	pairs, err := quickPairs(m)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var backends []string
	for _, b := range m.Backends {
		if b.Pending == "" {
			backends = append(backends, b.Name)
		}
	}
	start := time.Now()
	res, err := Run(ctx, Options{Manifest: m, Pairs: pairs, Backends: backends, Scenarios: CoreScenarios,
		Builder: &Builder{Root: "..", CacheDir: DefaultCacheDir(), TempDir: t.TempDir(), Log: t.Logf}, Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if want := len(pairs) * len(backends); len(res.Cells) != want {
		t.Fatalf("%d cells run, want %d", len(res.Cells), want)
	}
	for _, c := range res.Failed() {
		t.Errorf("daemon %s × agent %s over %s: expected %v, measured %+v: %s", c.Daemon, c.Agent, c.Backend, c.Expected, c.Measured, summary(&c))
	}
	t.Logf("%d cells in %v", len(res.Cells), time.Since(start).Round(time.Second))
}
