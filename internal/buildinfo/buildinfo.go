// Package buildinfo says which build a binary is: the module version, the
// VCS commit it was built from and whether the tree was modified, the Go
// version, and the protocol range it speaks (wire.Supported). Every
// command's --version, the agent's reported version and the
// forgeyard_build_info metric read it from here.
//
// The values come from runtime/debug.ReadBuildInfo (the main module's
// version, and the vcs.revision and vcs.modified settings of a build with
// -buildvcs); `make release` also sets them with
//
//	-ldflags "-X forgeyard.dev/transport/internal/buildinfo.version=v1.2.3
//	          -X forgeyard.dev/transport/internal/buildinfo.commit=0123abc…"
//
// which win over the build info (a release built from a tarball has no VCS
// data, and GOFLAGS=-buildvcs=false is common in CI).
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"forgeyard.dev/transport/wire"
)

// Set at link time by `make release` (see the package comment).
var (
	version  string
	commit   string
	modified string // "true" or "false"
)

// Devel is the version of a build that carries none: `go build` or `go run`
// inside the repository without -ldflags.
const Devel = "devel"

// Info describes one build.
type Info struct {
	Module    string             // module path, forgeyard.dev/transport
	Version   string             // module version, e.g. v1.2.3, or Devel
	Commit    string             // VCS revision, "" when unknown
	Modified  bool               // the tree had uncommitted changes
	GoVersion string             // e.g. go1.26.8
	Protocol  wire.ProtocolRange // protocol versions this build speaks
}

// Get returns the running binary's build information.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return from(bi, version, commit, modified)
}

// from builds an Info from a build info (nil: none) and the link-time
// values, which win when set.
func from(bi *debug.BuildInfo, ldVersion, ldCommit, ldModified string) Info {
	i := Info{Module: "forgeyard.dev/transport", GoVersion: runtime.Version(), Protocol: wire.Supported}
	if bi != nil {
		if bi.Main.Path != "" {
			i.Module = bi.Main.Path
		}
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			i.Version = v
		}
		if bi.GoVersion != "" {
			i.GoVersion = bi.GoVersion
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				i.Commit = s.Value
			case "vcs.modified":
				i.Modified = s.Value == "true"
			}
		}
	}
	if ldVersion != "" {
		i.Version = ldVersion
	}
	if i.Version == "" {
		i.Version = Devel
	}
	if ldCommit != "" {
		i.Commit = ldCommit
		i.Modified = ldModified == "true"
	}
	return i
}

// ShortCommit is the first 12 characters of the commit, "unknown" when
// there is none, with "+dirty" for a modified tree.
func (i Info) ShortCommit() string {
	c := i.Commit
	if c == "" {
		c = "unknown"
	} else if len(c) > 12 {
		c = c[:12]
	}
	if i.Modified {
		c += "+dirty"
	}
	return c
}

// UserAgent is prog/version, e.g. forgeyard-agent/v1.2.3: the version an
// agent reports to the daemon in its hello.
func (i Info) UserAgent(prog string) string { return prog + "/" + i.Version }

// String is the --version output of prog, one line, e.g.
//
//	forgeyard-agent v1.2.3 (commit 0123456789ab, go1.26.8, protocol 1.0-1.2)
func (i Info) String(prog string) string {
	return fmt.Sprintf("%s %s (commit %s, %s, protocol %s-%s)", prog, i.Version, i.ShortCommit(), i.GoVersion,
		i.Protocol.Min, i.Protocol.Max)
}

// Lines is the `version` subcommand's output: one "key: value" a line.
func (i Info) Lines(prog string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s\n", prog, i.Version)
	fmt.Fprintf(&b, "module:    %s\n", i.Module)
	fmt.Fprintf(&b, "commit:    %s\n", i.ShortCommit())
	fmt.Fprintf(&b, "go:        %s %s/%s\n", i.GoVersion, runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(&b, "protocol:  %s-%s\n", i.Protocol.Min, i.Protocol.Max)
	return b.String()
}

// MetricName is the build-info gauge's name.
const MetricName = "forgeyard_build_info"

// Collector returns the forgeyard_build_info gauge: always 1, its labels
// version, commit, goversion, protocol_min and protocol_max saying which
// build answers (the Prometheus build_info convention).
func (i Info) Collector() prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricName,
		Help: "Always 1; the labels say which build this process runs (version, VCS commit, Go version, protocol range).",
		ConstLabels: prometheus.Labels{"version": i.Version, "commit": i.ShortCommit(), "goversion": i.GoVersion,
			"protocol_min": i.Protocol.Min.String(), "protocol_max": i.Protocol.Max.String()}})
	g.Set(1)
	return g
}

// MustRegister registers the running binary's forgeyard_build_info on
// reg; it panics if reg has it already.
func MustRegister(reg prometheus.Registerer) { reg.MustRegister(Get().Collector()) }
