package matrix

import (
	"os"
	"slices"
	"strings"
	"testing"

	"forgeyard.dev/transport/wire"
)

func TestExpect(t *testing.T) {
	r := func(p string, fs ...string) Release { return Release{Name: p, Tag: HEAD, Protocol: p, Features: fs} }
	cases := []struct {
		d, a Release
		want Expectation
	}{
		{r("1.0-1.1", "LogResumeV1", "LogCompressionV1"), r("1.0-1.0", "LogResumeV1"),
			Expectation{Compatible: true, Protocol: "1.0", Features: []string{"LogResumeV1"}}},
		{r("1.0-1.0", "LogResumeV1"), r("1.0-1.1", "LogResumeV1", "LogCompressionV1"),
			Expectation{Compatible: true, Protocol: "1.0", Features: []string{"LogResumeV1"}}},
		{r("1.0-1.1", "CasRangeResumeV1", "LogCompressionV1"), r("1.0-1.1", "LogCompressionV1"),
			Expectation{Compatible: true, Protocol: "1.1", Features: []string{"LogCompressionV1"}}},
		{r("1.0-1.1"), r("2.0-2.0"),
			Expectation{Rejection: "no common protocol version: server supports 1.0–1.1, agent supports 2.0–2.0"}},
		{r("1.1-1.1"), r("1.0-1.0"),
			Expectation{Rejection: "no common protocol version: server supports 1.1–1.1, agent supports 1.0–1.0"}},
	}
	for _, c := range cases {
		got, err := Expect(c.d, c.a)
		if err != nil {
			t.Fatal(err)
		}
		if got.Compatible != c.want.Compatible || got.Protocol != c.want.Protocol || got.Rejection != c.want.Rejection ||
			!slices.Equal(got.Features, c.want.Features) && len(c.want.Features)+len(got.Features) > 0 {
			t.Errorf("Expect(%s, %s) = %+v, want %+v", c.d.Protocol, c.a.Protocol, got, c.want)
		}
	}
}

func TestJudge(t *testing.T) {
	exp := Expectation{Compatible: true, Protocol: "1.1", Features: []string{"LogResumeV1"}}
	ok := Cell{Expected: exp, Measured: Measured{Outcome: "compatible", Protocol: "1.1", Features: []string{"LogResumeV1"}},
		Scenarios: []ScenarioResult{{Name: "lease", Pass: true}}}
	if !judge(&ok) {
		t.Fatal("matching cell judged failed")
	}
	for name, mut := range map[string]func(*Cell){
		"scenario failed":  func(c *Cell) { c.Scenarios[0].Pass = false },
		"no scenarios":     func(c *Cell) { c.Scenarios = nil },
		"other version":    func(c *Cell) { c.Measured.Protocol = "1.0" },
		"other features":   func(c *Cell) { c.Measured.Features = nil },
		"rejected instead": func(c *Cell) { c.Measured = Measured{Outcome: "rejected", Rejection: "x"} },
	} {
		c := ok
		c.Scenarios = slices.Clone(ok.Scenarios)
		mut(&c)
		if judge(&c) {
			t.Errorf("%s: judged passed", name)
		}
	}
	rej := Cell{Expected: Expectation{Rejection: "no common protocol version: a"}, Measured: Measured{Outcome: "rejected", Rejection: "no common protocol version: b"},
		Scenarios: []ScenarioResult{{Name: "rejection", Pass: true}}}
	if judge(&rej) {
		t.Error("a rejection with another message judged passed")
	}
}

// TestManifestMatchesBuild: the manifest's HEAD entry states what this
// build speaks and implements, so the matrix's promises cannot drift from
// wire.Supported and wire.Implemented; and every released version's
// vectors are frozen.
func TestManifestMatchesBuild(t *testing.T) {
	m, err := LoadManifest("manifest.json")
	if err != nil {
		t.Fatal(err)
	}
	head, ok := m.Release(HEAD)
	if !ok || head.Tag != HEAD {
		t.Fatal("manifest has no HEAD release")
	}
	if rg, _ := head.Range(); rg != wire.Supported {
		t.Errorf("manifest HEAD protocol %s, this build supports %s", rg, wire.Supported)
	}
	if fs, _ := head.FeatureSet(); fs != wire.Implemented {
		t.Errorf("manifest HEAD features %v, this build implements %v", fs, wire.Implemented)
	}
	for _, r := range m.Releases {
		if r.Tag == HEAD {
			continue
		}
		rg, _ := r.Range()
		dir := "../wire/vectors/testdata/v" + rg.Max.String()
		if _, err := os.Stat(dir + "/RELEASED"); err != nil {
			t.Errorf("release %s speaks up to %s but %s is not RELEASED", r.Name, rg.Max, dir)
		}
	}
}

func TestCheckLog(t *testing.T) {
	var b strings.Builder
	for i := 0; i < 5; i++ {
		b.WriteString("synthetic abc line " + string(rune('0'+i)) + "\n")
	}
	if err := checkLog(b.String(), 5); err != nil {
		t.Fatal(err)
	}
	for name, log := range map[string]string{
		"duplicate": strings.Replace(b.String(), "line 2\n", "line 1\n", 1),
		"short":     strings.TrimSuffix(b.String(), "synthetic abc line 4\n"),
		"mixed":     strings.Replace(b.String(), "abc line 3", "xyz line 3", 1),
	} {
		if err := checkLog(log, 5); err == nil {
			t.Errorf("%s log accepted", name)
		}
	}
}
