// Package matrix is the cross-version compatibility matrix (ARCHITECTURE
// decision 16, spec §28, §167, §249–254): it builds the daemon and agent of
// every release listed in the manifest (old ones from their git tags, the
// current tree as HEAD), runs every (daemon release, agent release,
// backend) cell as separate processes through the matrix driver (the
// daemon's --matrix-driver endpoint and the agent's synthetic-executor
// flags), and compares what it measured with what the manifest promises:
// a compatible cell passes every scenario with the negotiated version and
// features the two releases' ranges and feature sets imply; an
// incompatible cell is rejected cleanly with the documented message
// ("no common protocol version: server supports …, agent supports …").
//
// The manifest is matrix/manifest.json; the last full run's results are
// matrix/results.json and are rendered into docs/compatibility.md, which a
// test keeps in sync. cmd/forgeyard-matrix (make matrix) runs the full
// matrix; TestQuickMatrix (make test) runs a quick subset.
package matrix

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"forgeyard.dev/transport/wire"
)

// HEAD is the tag of the release built from the current tree.
const HEAD = "HEAD"

// Manifest lists the releases and backends of the matrix (§249).
type Manifest struct {
	// Releases in release order, oldest first; the last one is normally
	// HEAD (the current tree).
	Releases []Release `json:"releases"`
	// Peers are test-only builds that are not releases, such as an agent
	// speaking only a future major version; each takes part in its Role.
	Peers []Release `json:"peers"`
	// Backends of every cell.
	Backends []Backend `json:"backends"`
}

// Release is one release (or test peer) and what it promises.
type Release struct {
	Name string `json:"name"`
	// Tag is the git tag it is built from, or HEAD for the current tree.
	Tag string `json:"tag"`
	// Commit is the full hash the tag names, pinned when the release is
	// made. A clone that lacks the tag (tags are not always fetched or
	// pushed) builds the release from this commit; one whose tag names
	// another commit is refused, because a release never moves.
	Commit string `json:"commit,omitempty"`
	// Protocol is the range it speaks, "1.0-1.1".
	Protocol string `json:"protocol"`
	// Features it implements (offered by its daemon, advertised by its
	// agent), by name (wire.ProtocolFeature.String).
	Features []string `json:"features"`
	// AgentArgs and DaemonArgs are extra flags for its agent or daemon (a
	// test peer's --protocol).
	AgentArgs  []string `json:"agent_args,omitempty"`
	DaemonArgs []string `json:"daemon_args,omitempty"`
	// Role of a peer: "agent" (the default) or "daemon". Releases are
	// both.
	Role string `json:"role,omitempty"`
	// Relay: the release ships cmd/forgeyard-relay and its daemon accepts
	// agents relayed by it (ARCHITECTURE decision 10). Relay cells apply
	// when the daemon's release has it; an agent of any release reaches a
	// relay like any yamux or WebTransport endpoint.
	Relay bool `json:"relay,omitempty"`
	// Note is shown in docs/compatibility.md.
	Note string `json:"note,omitempty"`
}

// Backend is one backend column.
type Backend struct {
	Name string `json:"name"` // quic, webtransport, yamux, relay+yamux, relay+webtransport
	// Pending: declared but not run (the build lacks what it needs); the
	// reason says what.
	Pending string `json:"pending,omitempty"`
}

// Range parses r.Protocol.
func (r Release) Range() (wire.ProtocolRange, error) { return wire.ParseRange(r.Protocol) }

// FeatureSet parses r.Features.
func (r Release) FeatureSet() (wire.FeatureSet, error) {
	var s wire.FeatureSet
	for _, n := range r.Features {
		f, ok := featureByName(n)
		if !ok {
			return 0, fmt.Errorf("release %s: unknown feature %q", r.Name, n)
		}
		s = s.With(f)
	}
	return s, nil
}

func featureByName(n string) (wire.ProtocolFeature, bool) {
	for f := wire.ProtocolFeature(0); f < 64; f++ {
		if f.String() == n {
			return f, true
		}
	}
	return 0, false
}

// LoadManifest reads and validates a manifest file.
func LoadManifest(path string) (*Manifest, error) {
	m, err := readJSON[Manifest](path)
	if err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// Validate checks names are unique and ranges and features parse.
func (m *Manifest) Validate() error {
	if len(m.Releases) == 0 || len(m.Backends) == 0 {
		return errors.New("manifest: needs releases and backends")
	}
	seen := map[string]bool{}
	for _, r := range append(slices.Clone(m.Releases), m.Peers...) {
		if r.Name == "" || r.Tag == "" || seen[r.Name] {
			return fmt.Errorf("manifest: release %q: name and tag required, names unique", r.Name)
		}
		seen[r.Name] = true
		if r.Tag != HEAD && !isCommitHash(r.Commit) {
			return fmt.Errorf("manifest: release %s: commit must be the full 40-digit hash tag %s names (git rev-parse %s^{commit})", r.Name, r.Tag, r.Tag)
		}
		if _, err := r.Range(); err != nil {
			return fmt.Errorf("manifest: release %s: %w", r.Name, err)
		}
		if _, err := r.FeatureSet(); err != nil {
			return fmt.Errorf("manifest: %w", err)
		}
		if r.Role != "" && r.Role != "agent" && r.Role != "daemon" {
			return fmt.Errorf("manifest: release %s: role %q (want agent or daemon)", r.Name, r.Role)
		}
	}
	for _, b := range m.Backends {
		if _, ok := backendSchemes[strings.TrimPrefix(b.Name, "relay+")]; !ok && b.Pending == "" {
			return fmt.Errorf("manifest: backend %q unknown (and not pending)", b.Name)
		}
	}
	return nil
}

// Daemons lists the releases and the daemon peers (matrix rows).
func (m *Manifest) Daemons() []Release {
	out := slices.Clone(m.Releases)
	for _, p := range m.Peers {
		if p.Role == "daemon" {
			out = append(out, p)
		}
	}
	return out
}

// Agents lists the releases and the agent peers (matrix columns).
func (m *Manifest) Agents() []Release {
	out := slices.Clone(m.Releases)
	for _, p := range m.Peers {
		if p.Role != "daemon" {
			out = append(out, p)
		}
	}
	return out
}

// Release returns the release or peer named name.
func (m *Manifest) Release(name string) (Release, bool) {
	for _, r := range append(slices.Clone(m.Releases), m.Peers...) {
		if r.Name == name {
			return r, true
		}
	}
	return Release{}, false
}

// CellPending says why the cell (d, a, b) is not run, or "" when it is:
// the backend is pending, or it is a relay backend and the daemon's
// release predates the relay.
func CellPending(d, a Release, b Backend) string {
	if b.Pending != "" {
		return b.Pending
	}
	if strings.HasPrefix(b.Name, "relay+") {
		if !d.Relay {
			return "n/a: daemon " + d.Name + " predates forgeyard-relay"
		}
	}
	return ""
}

// Expectation is what the manifest promises for a (daemon, agent) pair.
type Expectation struct {
	Compatible bool   `json:"compatible"`
	Protocol   string `json:"protocol,omitempty"` // negotiated, when compatible
	// Features negotiated (daemon's ∩ agent's), in ascending order.
	Features []string `json:"features,omitempty"`
	// Rejection is the documented message, when incompatible (§252–254).
	Rejection string `json:"rejection,omitempty"`
}

// Expect derives the expected outcome of daemon d with agent a from their
// ranges and features: wire.Negotiate's answer, and the intersection.
func Expect(d, a Release) (Expectation, error) {
	dr, ar, err := both(d, a, Release.Range)
	if err != nil {
		return Expectation{}, err
	}
	v, err := wire.Negotiate(dr, ar)
	if err != nil {
		return Expectation{Rejection: err.Error()}, nil
	}
	df, af, err := both(d, a, Release.FeatureSet)
	if err != nil {
		return Expectation{}, err
	}
	e := Expectation{Compatible: true, Protocol: v.String(), Features: []string{}}
	for _, f := range df.Intersect(af).List() {
		e.Features = append(e.Features, f.String())
	}
	return e, nil
}

// both is of(d) and of(a); the error is the first one's, d's before a's.
func both[T any](d, a Release, of func(Release) (T, error)) (dv, av T, err error) {
	if dv, err = of(d); err != nil {
		return dv, av, err
	}
	av, err = of(a)
	return dv, av, err
}

// String renders e for tables and messages.
func (e Expectation) String() string {
	if !e.Compatible {
		return "rejected: " + e.Rejection
	}
	return fmt.Sprintf("%s %v", e.Protocol, e.Features)
}

func isCommitHash(s string) bool {
	if len(s) != 40 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
