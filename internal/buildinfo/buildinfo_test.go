package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"forgeyard.dev/transport/wire"
)

func TestFrom(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "forgeyard.dev/transport", Version: "v1.4.0"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"}}}
	for _, c := range []struct {
		name                string
		bi                  *debug.BuildInfo
		ldv, ldc, ldm       string
		version, short, goV string
	}{
		{"module version and vcs settings", bi, "", "", "", "v1.4.0", "0123456789ab+dirty", "go1.26.8"},
		{"link-time values win", bi, "v1.5.0-rc.1", "fedcba9876543210", "false", "v1.5.0-rc.1", "fedcba987654", "go1.26.8"},
		{"a devel build without vcs data", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "forgeyard.dev/transport", Version: "(devel)"}},
			"", "", "", Devel, "unknown", "go1.26.8"},
		{"no build info at all", nil, "", "", "", Devel, "unknown", ""},
	} {
		i := from(c.bi, c.ldv, c.ldc, c.ldm)
		if i.Version != c.version || i.ShortCommit() != c.short || (c.goV != "" && i.GoVersion != c.goV) || i.Protocol != wire.Supported || i.Module != "forgeyard.dev/transport" {
			t.Errorf("%s: %+v (short commit %q); want version %q, commit %q", c.name, i, i.ShortCommit(), c.version, c.short)
		}
	}
}

func TestStringsAndUserAgent(t *testing.T) {
	i := from(&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.4.0"}}, "", "abc", "false")
	if got, want := i.String("forgeyard-agent"), "forgeyard-agent v1.4.0 (commit abc, go1.26.8, protocol "+wire.Supported.Min.String()+"-"+wire.Supported.Max.String()+")"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	if got := i.UserAgent("forgeyard-agent"); got != "forgeyard-agent/v1.4.0" {
		t.Errorf("UserAgent = %q", got)
	}
	for _, want := range []string{"forgeyard-relay v1.4.0\n", "commit:    abc\n", "protocol:  " + wire.Supported.Min.String()} {
		if !strings.Contains(i.Lines("forgeyard-relay"), want) {
			t.Errorf("Lines lacks %q:\n%s", want, i.Lines("forgeyard-relay"))
		}
	}
}

// TestCollector: forgeyard_build_info is a gauge of 1 with the five labels,
// and lints clean (the Prometheus conventions promtool checks).
func TestCollector(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	i := from(&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.4.0"}}, "", "0123456789abcdef", "false")
	reg.MustRegister(i.Collector())
	want := `# HELP forgeyard_build_info Always 1; the labels say which build this process runs (version, VCS commit, Go version, protocol range).
# TYPE forgeyard_build_info gauge
forgeyard_build_info{commit="0123456789ab",goversion="go1.26.8",protocol_max="` + wire.Supported.Max.String() + `",protocol_min="` + wire.Supported.Min.String() + `",version="v1.4.0"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), MetricName); err != nil {
		t.Error(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	MustRegister(prometheus.NewRegistry()) // the running binary's, registrable
}
