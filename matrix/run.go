package matrix

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Scenarios, in run order. CoreScenarios is the quick subset.
var (
	Scenarios = []string{"negotiation", "features", "lease", "duplicate", "lost-ack", "cancel", "resync", "log-resume", "cas-resume"}
	// CoreScenarios run in the quick matrix of `make test`.
	CoreScenarios = []string{"negotiation", "features", "lease", "lost-ack"}
)

// scenarioDoc describes each scenario (rendered in docs/compatibility.md).
var scenarioDoc = map[string]string{
	"negotiation": "the agent registers; the session's negotiated version is the highest common one and the daemon reports its manifest range",
	"features":    "the session's negotiated features are the intersection of both releases' manifest features; the daemon offers exactly its manifest features",
	"lease":       "offer → accept → run → logs and output stored → one completion acknowledged Accepted",
	"duplicate":   "the connection is cut when the agent's accept arrives; after reconnect the attempt completes exactly once (first ack Accepted, any repeat DuplicateAccepted)",
	"lost-ack":    "the connection is cut after the daemon recorded the completion and before the ack is sent; the agent resends it on the new connection and gets DuplicateAccepted",
	"cancel":      "a long attempt is cancelled once the agent reported its first phase; the agent acknowledges and completes it Cancelled",
	"resync":      "the connection is cut while the attempt runs; the agent reconnects (epoch ≥ 2), resyncs and completes it once",
	"log-resume":  "the connection is cut after the daemon stored 2 log frames; the stored log is every line exactly once, in order",
	"cas-resume":  "the connection is cut after the daemon received 1 MiB of an 8 MiB output; the output is stored verified and was not re-sent from the start",
	"rejection":   "the agent is refused with UnsupportedVersion and exits 1 printing the documented message naming both ranges; no session is registered",
}

// ScenarioResult is one scenario's outcome in a cell.
type ScenarioResult struct {
	Name   string `json:"name"`
	Pass   bool   `json:"pass"`
	Detail string `json:"detail,omitempty"`
}

// Measured is what a cell observed.
type Measured struct {
	// Outcome: "compatible" (registered), "rejected" (refused with the
	// agent exiting), or "error".
	Outcome   string   `json:"outcome"`
	Protocol  string   `json:"protocol,omitempty"`
	Features  []string `json:"features,omitempty"`
	Rejection string   `json:"rejection,omitempty"`
}

// Cell is one (daemon release, agent release, backend) combination.
type Cell struct {
	Daemon    string           `json:"daemon"`
	Agent     string           `json:"agent"`
	Backend   string           `json:"backend"`
	Expected  Expectation      `json:"expected"`
	Measured  Measured         `json:"measured"`
	Scenarios []ScenarioResult `json:"scenarios"`
	// Pending: the cell was not run (its backend is pending).
	Pending string `json:"pending,omitempty"`
	Pass    bool   `json:"pass"`
}

// Results is a run of the matrix. It holds no timestamps, so an identical
// run renders identically.
type Results struct {
	// Full: every release pair and scenario of the manifest was run.
	Full  bool   `json:"full"`
	Cells []Cell `json:"cells"`
	// Builds names the commit each release was built from.
	Builds map[string]string `json:"builds"`
}

// Failed returns the cells that did not pass (pending cells excluded).
func (r *Results) Failed() []Cell {
	var out []Cell
	for _, c := range r.Cells {
		if c.Pending == "" && !c.Pass {
			out = append(out, c)
		}
	}
	return out
}

// Options select what Run runs.
type Options struct {
	Manifest *Manifest
	Builder  *Builder
	// Pairs restricts the (daemon, agent) release pairs; nil means every
	// release as daemon with every release and peer as agent.
	Pairs [][2]string
	// Backends restricts the backends; nil means all of the manifest.
	Backends []string
	// Scenarios restricts the scenarios of compatible cells; nil means all.
	Scenarios []string
	// Relay is the forgeyard-relay binary of relay cells; empty means the
	// current tree's (built with HEAD).
	Relay string
	// Log receives progress lines; nil discards.
	Log func(format string, args ...any)
}

// AllPairs lists every (daemon, agent) pair of m: each release and daemon
// peer as daemon with each release and agent peer as agent.
func AllPairs(m *Manifest) [][2]string {
	var out [][2]string
	for _, d := range m.Daemons() {
		for _, a := range m.Agents() {
			out = append(out, [2]string{d.Name, a.Name})
		}
	}
	return out
}

func (o *Options) logf(format string, args ...any) {
	if o.Log != nil {
		o.Log(format, args...)
	}
}

// Run builds the releases and runs the selected cells. It returns an error
// only when it could not run (a build failed); cell failures are in the
// results (see Results.Failed).
func Run(ctx context.Context, o Options) (*Results, error) {
	m := o.Manifest
	pairs := o.Pairs
	full := pairs == nil && o.Backends == nil && o.Scenarios == nil
	if pairs == nil {
		pairs = AllPairs(m)
	}
	scen := o.Scenarios
	if scen == nil {
		scen = Scenarios
	}
	res := &Results{Full: full, Builds: map[string]string{}}
	bins := map[string]Binaries{}
	build := func(name string) (Binaries, error) {
		if b, ok := bins[name]; ok {
			return b, nil
		}
		r, ok := m.Release(name)
		if !ok {
			return Binaries{}, fmt.Errorf("matrix: no release %q in the manifest", name)
		}
		b, err := o.Builder.Build(ctx, r)
		if err != nil {
			return Binaries{}, err
		}
		bins[name] = b
		if r.Tag == HEAD {
			res.Builds[name] = "HEAD"
		} else {
			res.Builds[name] = r.Tag + " " + b.Commit
		}
		return b, nil
	}
	relay := o.Relay
	for _, be := range m.Backends {
		if relay == "" && be.Pending == "" && strings.HasPrefix(be.Name, "relay+") && (o.Backends == nil || slices.Contains(o.Backends, be.Name)) {
			head := Release{Name: HEAD, Tag: HEAD}
			b, err := o.Builder.Build(ctx, head)
			if err != nil {
				return nil, err
			}
			if b.Relay == "" {
				return nil, fmt.Errorf("matrix: backend %s needs cmd/forgeyard-relay in the current tree (or mark it pending in the manifest)", be.Name)
			}
			relay = b.Relay
		}
	}
	for _, p := range pairs {
		d, _ := m.Release(p[0])
		a, _ := m.Release(p[1])
		exp, err := Expect(d, a)
		if err != nil {
			return nil, err
		}
		var db, ab Binaries
		if db, err = build(p[0]); err == nil {
			ab, err = build(p[1])
		}
		if err != nil {
			return nil, err
		}
		var cells []*Cell
		for _, be := range m.Backends {
			if o.Backends != nil && !slices.Contains(o.Backends, be.Name) {
				continue
			}
			c := &Cell{Daemon: d.Name, Agent: a.Name, Backend: be.Name, Expected: exp, Pending: CellPending(d, a, be)}
			cells = append(cells, c)
			res.Cells = append(res.Cells, Cell{}) // placeholder, filled below
		}
		if err := runPair(ctx, o, db, ab, d, a, relay, cells, scen); err != nil {
			for _, c := range cells {
				if c.Pending == "" && c.Measured.Outcome == "" {
					c.Measured.Outcome = "error"
					c.Scenarios = append(c.Scenarios, ScenarioResult{Name: "setup", Detail: err.Error()})
				}
			}
		}
		base := len(res.Cells) - len(cells)
		for i, c := range cells {
			if c.Pending == "" {
				c.Pass = judge(c)
			}
			res.Cells[base+i] = *c
			o.logf("%-8s daemon %-8s agent %-12s %-20s %s", verdict(c), c.Daemon, c.Agent, c.Backend, summary(c))
		}
	}
	return res, nil
}

// judge: every scenario passed and the measured outcome is the expected
// one.
func judge(c *Cell) bool {
	if len(c.Scenarios) == 0 {
		return false
	}
	for _, s := range c.Scenarios {
		if !s.Pass {
			return false
		}
	}
	e := c.Expected
	if !e.Compatible {
		return c.Measured.Outcome == "rejected" && c.Measured.Rejection == e.Rejection
	}
	return c.Measured.Outcome == "compatible" && c.Measured.Protocol == e.Protocol && slices.Equal(c.Measured.Features, e.Features)
}

func verdict(c *Cell) string {
	switch {
	case c.Pending != "":
		return "PENDING"
	case c.Pass:
		return "ok"
	}
	return "FAIL"
}

func summary(c *Cell) string {
	if c.Pending != "" {
		return c.Pending
	}
	var failed []string
	for _, s := range c.Scenarios {
		if !s.Pass {
			failed = append(failed, s.Name+": "+s.Detail)
		}
	}
	if len(failed) > 0 {
		return strings.Join(failed, "; ")
	}
	if c.Measured.Outcome == "rejected" {
		return "rejected: " + c.Measured.Rejection
	}
	return fmt.Sprintf("%s %v, %d scenarios", c.Measured.Protocol, c.Measured.Features, len(c.Scenarios))
}

// runPair starts one daemon and runs every backend's cell of the pair
// against it, one agent process per scenario.
func runPair(ctx context.Context, o Options, db, ab Binaries, dr, a Release, relayBin string, cells []*Cell, scen []string) error {
	dir, err := os.MkdirTemp(o.Builder.TempDir, "cell-")
	if err != nil {
		return err
	}
	defer removeAll(dir)
	d, err := startDaemon(ctx, db.Daemon, dir, dr.DaemonArgs)
	if err != nil {
		return err
	}
	defer d.stop(10 * time.Second)
	var relayAddrs map[string]string
	if slices.ContainsFunc(cells, func(c *Cell) bool { return c.Pending == "" && strings.HasPrefix(c.Backend, "relay+") }) {
		rp, addrs, err := startRelay(ctx, relayBin, d.pki, d.addrs["quic"])
		if err != nil {
			return err
		}
		defer rp.stop(10 * time.Second)
		relayAddrs = addrs
	}
	r := &cellRun{m: o.Manifest, d: d, agentBin: ab.Agent, agentArgs: a.AgentArgs, seen: map[string]bool{}}
	for _, c := range cells {
		if c.Pending != "" {
			continue
		}
		be, relayed := strings.CutPrefix(c.Backend, "relay+")
		addrs := d.addrs
		if relayed {
			addrs = relayAddrs
		}
		addr, ok := addrs[be]
		if !ok {
			c.Measured.Outcome = "error"
			c.Scenarios = []ScenarioResult{{Name: "setup", Detail: "no " + c.Backend + " listener"}}
			continue
		}
		r.endpoint = backendSchemes[be] + "://" + addr
		r.cell = c
		if !c.Expected.Compatible {
			c.Scenarios = append(c.Scenarios, r.rejection(ctx))
			continue
		}
		for _, s := range scen {
			res := r.scenario(ctx, s)
			c.Scenarios = append(c.Scenarios, res)
			if s == "negotiation" && !res.Pass && c.Measured.Outcome != "compatible" {
				break // nothing else can work
			}
		}
	}
	if d.exitedEarly() {
		return fmt.Errorf("daemon exited during the cell: %s", lastLines(d.stderr.String(), 5))
	}
	return nil
}

func (d *daemonProc) exitedEarly() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// cellRun runs the scenarios of one cell.
type cellRun struct {
	m         *Manifest
	d         *daemonProc
	agentBin  string
	agentArgs []string
	endpoint  string
	cell      *Cell
	seen      map[string]bool // runners of earlier scenarios
	n         int
}

// scenario runs one scenario with a fresh agent process.
func (r *cellRun) scenario(ctx context.Context, name string) ScenarioResult {
	res := ScenarioResult{Name: name}
	err := r.run(ctx, name)
	if err != nil {
		res.Detail = err.Error()
	} else {
		res.Pass = true
	}
	return res
}

// agentArgsFor are the synthetic executor settings of each scenario.
func agentArgsFor(name string) []string {
	switch name {
	case "duplicate", "resync":
		return []string{"--synthetic-duration", "600ms"}
	case "cancel":
		return []string{"--synthetic-duration", "10m"}
	case "log-resume":
		return []string{"--synthetic-duration", "300ms", "--synthetic-log-lines", strconv.Itoa(logResumeLines)}
	case "cas-resume":
		return []string{"--synthetic-duration", "30ms", "--synthetic-output-size", strconv.Itoa(casResumeSize)}
	}
	return nil
}

const (
	logResumeLines = 20000 // ≈ 640 KB of log: about ten 64 KiB frames
	casResumeSize  = 8 << 20
)

// session starts an agent and waits for its registration.
func (r *cellRun) session(ctx context.Context, name string) (*agentProc, driverSession, error) {
	r.n++
	ag, err := startAgent(ctx, r.agentBin, r.d.pki, fmt.Sprintf("%s-%d", name, r.n), r.endpoint, append(slices.Clone(r.agentArgs), agentArgsFor(name)...))
	if err != nil {
		return nil, driverSession{}, err
	}
	var s driverSession
	err = poll(ctx, 20*time.Second, "agent registration", func() (bool, error) {
		select {
		case <-ag.done:
			return false, fmt.Errorf("%w (code %d): %s", errAgentExited, ag.exitCode(), lastLines(ag.stderr.String(), 3))
		default:
		}
		ss, err := r.d.sessions(ctx)
		if err != nil {
			return false, err
		}
		for _, x := range ss {
			if !r.seen[x.Runner] && x.State == "Active" {
				s = x
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		ag.stop(5 * time.Second)
		return nil, s, err
	}
	r.seen[s.Runner] = true
	return ag, s, nil
}

// run runs one scenario (scenarioDoc) with a fresh agent process.
func (r *cellRun) run(ctx context.Context, name string) error {
	ag, s, err := r.session(ctx, name)
	if err != nil {
		return err
	}
	defer ag.stop(10 * time.Second)
	switch name {
	case "negotiation":
		return r.negotiation(ctx, s)
	case "features":
		return r.features(ctx, s)
	case "lease":
		return r.leaseScenario(ctx, s)
	case "duplicate", "resync":
		return r.cutAndReconnect(ctx, s, name)
	case "lost-ack":
		return r.lostAck(ctx, s)
	case "cancel":
		return r.cancel(ctx, s)
	case "log-resume":
		return r.logResume(ctx, s)
	case "cas-resume":
		return r.casResume(ctx, s)
	}
	return fmt.Errorf("unknown scenario %q", name)
}

// negotiation is the "negotiation" scenario: the negotiated version and
// the daemon's reported range match the manifest.
func (r *cellRun) negotiation(ctx context.Context, s driverSession) error {
	c := r.cell
	c.Measured = Measured{Outcome: "compatible", Protocol: s.Protocol, Features: s.Features}
	var info struct {
		Protocol string   `json:"protocol"`
		Features []string `json:"features"`
	}
	if err := r.d.call(ctx, "GET", "/v1/matrix/info", nil, &info); err != nil {
		return err
	}
	dr, _ := r.releaseRange(c.Daemon)
	if info.Protocol != dr {
		return fmt.Errorf("daemon %s reports protocol range %s, manifest says %s", c.Daemon, info.Protocol, dr)
	}
	if s.Protocol != c.Expected.Protocol {
		return fmt.Errorf("negotiated %s, manifest implies %s", s.Protocol, c.Expected.Protocol)
	}
	if s.AgentVersion == "" || s.Backend != backendName(c.Backend) {
		return fmt.Errorf("session reports agent version %q over %q", s.AgentVersion, s.Backend)
	}
	return nil
}

// features is the "features" scenario: the offered and negotiated
// features match the manifest, and the log encoding shows them.
func (r *cellRun) features(ctx context.Context, s driverSession) error {
	c := r.cell
	var info struct {
		Features []string `json:"features"`
	}
	if err := r.d.call(ctx, "GET", "/v1/matrix/info", nil, &info); err != nil {
		return err
	}
	if !slices.Equal(info.Features, r.releaseFeatures(c.Daemon)) {
		return fmt.Errorf("daemon %s offers %v, manifest says %v", c.Daemon, info.Features, r.releaseFeatures(c.Daemon))
	}
	if !slices.Equal(s.Features, c.Expected.Features) {
		return fmt.Errorf("negotiated features %v, manifest implies %v", s.Features, c.Expected.Features)
	}
	// A negotiated behaviour must be visible: with LogCompressionV1
	// the agent's log streams are Flate, without it Raw (drivers
	// from 1.1 on report the encoding).
	at, err := r.completedLease(ctx, s, "", 1)
	if err != nil {
		return err
	}
	return checkLogEncoding(at, slices.Contains(c.Expected.Features, "LogCompressionV1"), r.releaseFeatures(c.Daemon), r.releaseFeatures(c.Agent))
}

// leaseScenario is the "lease" scenario: one attempt completes once with
// its logs and output stored.
func (r *cellRun) leaseScenario(ctx context.Context, s driverSession) error {
	at, err := r.completedLease(ctx, s, "", 1)
	if err != nil {
		return err
	}
	return checkData(at, 4, 256)
}

// cutAndReconnect is the "duplicate" and "resync" scenarios: the
// connection is cut at the agent's accept or while the attempt runs, and
// the attempt completes once after the reconnect.
func (r *cellRun) cutAndReconnect(ctx context.Context, s driverSession, name string) error {
	cut := map[string]string{"duplicate": "accept", "resync": "running"}[name]
	return r.cutLease(ctx, s, cut, 1, nil)
}

// lostAck is the "lost-ack" scenario: the resent completion is
// acknowledged DuplicateAccepted.
func (r *cellRun) lostAck(ctx context.Context, s driverSession) error {
	return r.cutLease(ctx, s, "completion", 2, func(at *driverAttempt) error {
		if at.Completions[1].Ack != "DuplicateAccepted" {
			return fmt.Errorf("resent completion acknowledged %s, want DuplicateAccepted", at.Completions[1].Ack)
		}
		return nil
	})
}

// completedLease is a lease (its connection cut at cut; "": not cut) that
// completed completions times.
func (r *cellRun) completedLease(ctx context.Context, s driverSession, cut string, completions int) (*driverAttempt, error) {
	at, err := r.lease(ctx, s, cut)
	if err != nil {
		return nil, err
	}
	if err := checkCompleted(at, completions); err != nil {
		return nil, err
	}
	return at, nil
}

// cutLease is the shape of the scenarios that cut the connection: a lease
// whose connection is cut at cut completes with completions completions,
// passes check (nil: no more), and the agent reconnected.
func (r *cellRun) cutLease(ctx context.Context, s driverSession, cut string, completions int, check func(*driverAttempt) error) error {
	at, err := r.completedLease(ctx, s, cut, completions)
	if err != nil {
		return err
	}
	if check != nil {
		if err := check(at); err != nil {
			return err
		}
	}
	return r.checkReconnected(ctx, s)
}

// cancel is the "cancel" scenario: a running attempt is cancelled and
// completes Cancelled.
func (r *cellRun) cancel(ctx context.Context, s driverSession) error {
	var off struct{ Attempt string }
	if err := r.d.call(ctx, "POST", "/v1/matrix/offer", map[string]string{"runner": s.Runner}, &off); err != nil {
		return err
	}
	if _, err := r.waitAttempt(ctx, off.Attempt, func(a *driverAttempt) bool { return len(a.Phases) > 0 }); err != nil {
		return err
	}
	if err := r.d.call(ctx, "POST", "/v1/matrix/cancel", map[string]string{"attempt": off.Attempt}, nil); err != nil {
		return err
	}
	at, err := r.waitAttempt(ctx, off.Attempt, func(a *driverAttempt) bool { return len(a.Completions) > 0 })
	if err != nil {
		return err
	}
	if cm := at.Completions[0]; cm.Result != "Cancelled" || cm.Ack != "Accepted" {
		return fmt.Errorf("completion %s acknowledged %s, want Cancelled / Accepted", cm.Result, cm.Ack)
	}
	return nil
}

// logResume is the "log-resume" scenario: after a cut during the log the
// stored log is every line exactly once.
func (r *cellRun) logResume(ctx context.Context, s driverSession) error {
	return r.cutLease(ctx, s, "log", 1, func(at *driverAttempt) error { return checkLog(at.Log, logResumeLines) })
}

// casResume is the "cas-resume" scenario: after a cut during an upload the
// output is stored and was resumed, not re-sent from the start.
func (r *cellRun) casResume(ctx context.Context, s driverSession) error {
	return r.cutLease(ctx, s, "upload", 1, func(at *driverAttempt) error {
		if err := checkData(at, 4, casResumeSize); err != nil {
			return err
		}
		if got := at.Outputs[0].Received; got >= casResumeSize+1<<20 {
			return fmt.Errorf("the daemon received %d bytes for a %d-byte output: the upload restarted instead of resuming", got, casResumeSize)
		}
		return nil
	})
}

// backendName is the backend the daemon sees for a cell's backend: a
// relay reaches the daemon over QUIC.
func backendName(b string) string {
	if strings.HasPrefix(b, "relay+") {
		return "quic"
	}
	return b
}

func (r *cellRun) releaseRange(name string) (string, error) {
	for _, rel := range r.manifestReleases() {
		if rel.Name == name {
			rg, err := rel.Range()
			return rg.String(), err
		}
	}
	return "", fmt.Errorf("no release %s", name)
}

func (r *cellRun) releaseFeatures(name string) []string {
	for _, rel := range r.manifestReleases() {
		if rel.Name == name {
			fs, _ := rel.FeatureSet()
			out := []string{}
			for _, f := range fs.List() {
				out = append(out, f.String())
			}
			return out
		}
	}
	return nil
}

func (r *cellRun) manifestReleases() []Release {
	return append(slices.Clone(r.m.Releases), r.m.Peers...)
}

// lease offers one lease (cut armed as given) and waits for its
// completion to be recorded and the logs and outputs to settle.
func (r *cellRun) lease(ctx context.Context, s driverSession, cut string) (*driverAttempt, error) {
	var off struct{ Attempt string }
	if err := r.d.call(ctx, "POST", "/v1/matrix/offer", map[string]string{"runner": s.Runner, "cut_on": cut}, &off); err != nil {
		return nil, err
	}
	want := 1
	if cut == "completion" {
		want = 2
	}
	return r.waitAttempt(ctx, off.Attempt, func(a *driverAttempt) bool { return len(a.Completions) >= want })
}

func (r *cellRun) waitAttempt(ctx context.Context, id string, cond func(*driverAttempt) bool) (*driverAttempt, error) {
	var at driverAttempt
	err := poll(ctx, 60*time.Second, "attempt "+id, func() (bool, error) {
		at = driverAttempt{}
		if err := r.d.call(ctx, "GET", "/v1/matrix/attempt?id="+id, nil, &at); err != nil {
			return false, err
		}
		return cond(&at), nil
	})
	return &at, err
}

// checkReconnected: the agent's session is active again on a later epoch
// (the cut happened and the agent came back under the same session).
func (r *cellRun) checkReconnected(ctx context.Context, s driverSession) error {
	return poll(ctx, 20*time.Second, "reconnection", func() (bool, error) {
		ss, err := r.d.sessions(ctx)
		if err != nil {
			return false, err
		}
		for _, x := range ss {
			if x.Session == s.Session && x.Epoch > s.Epoch && x.State == "Active" {
				return true, nil
			}
		}
		return false, nil
	})
}

func checkCompleted(at *driverAttempt, n int) error {
	if len(at.Completions) != n {
		return fmt.Errorf("%d completions recorded, want %d: %+v", len(at.Completions), n, at.Completions)
	}
	if c := at.Completions[0]; c.Ack != "Accepted" || c.Result != "Succeeded" {
		return fmt.Errorf("completion %s acknowledged %s, want Succeeded / Accepted", c.Result, c.Ack)
	}
	for _, c := range at.Completions[1:] {
		if c.Ack != "DuplicateAccepted" {
			return fmt.Errorf("repeated completion acknowledged %s, want DuplicateAccepted", c.Ack)
		}
	}
	return nil
}

// checkData: the stored log has lines 0..lines-1 and the one output is
// stored verified with the given size.
func checkData(at *driverAttempt, lines int, size uint64) error {
	if err := checkLog(at.Log, lines); err != nil {
		return err
	}
	if !at.OutputsFinalized || len(at.Outputs) != 1 {
		return fmt.Errorf("outputs finalized %v: %d outputs, want 1", at.OutputsFinalized, len(at.Outputs))
	}
	if o := at.Outputs[0]; !o.Stored || o.Size != size {
		return fmt.Errorf("output %s: %d bytes, stored %v; want %d bytes stored", o.Digest, o.Size, o.Stored, size)
	}
	return nil
}

// checkLog: exactly lines lines, the i-th ending in " line i", all of the
// same attempt (no duplicate, gap or reorder).
func checkLog(log string, lines int) error {
	got := strings.Split(strings.TrimSuffix(log, "\n"), "\n")
	if log == "" {
		got = nil
	}
	if len(got) != lines {
		return fmt.Errorf("stored log has %d lines, want %d", len(got), lines)
	}
	prefix := ""
	for i, l := range got {
		p, ok := strings.CutSuffix(l, " line "+strconv.Itoa(i))
		if !ok || (prefix != "" && p != prefix) {
			return fmt.Errorf("stored log line %d is %q: duplicated, missing or reordered lines", i, l)
		}
		prefix = p
	}
	return nil
}

// checkLogEncoding: a daemon implementing LogCompressionV1 reports the log
// stream encoding (its driver is from protocol 1.1 on; older ones do not
// report it): an attempt's log was compressed exactly when the feature was
// negotiated — or, with an agent from before the feature, compressed as
// 1.0 agents always do.
func checkLogEncoding(at *driverAttempt, negotiated bool, daemonFeatures, agentFeatures []string) error {
	if !slices.Contains(daemonFeatures, "LogCompressionV1") {
		return nil // a 1.0 daemon's driver does not report it
	}
	if at.LogEncoding == "" {
		return fmt.Errorf("the daemon reported no log stream encoding")
	}
	want := "Raw"
	if negotiated || !slices.Contains(agentFeatures, "LogCompressionV1") {
		want = "Flate"
	}
	if at.LogEncoding != want {
		return fmt.Errorf("log stream encoding %s, want %s (LogCompressionV1 negotiated: %v)", at.LogEncoding, want, negotiated)
	}
	return nil
}

// rejection starts the agent of an incompatible pair and expects the
// documented refusal.
func (r *cellRun) rejection(ctx context.Context) ScenarioResult {
	res := ScenarioResult{Name: "rejection"}
	r.n++
	ag, err := startAgent(ctx, r.agentBin, r.d.pki, fmt.Sprintf("rejected-%d", r.n), r.endpoint, r.agentArgs)
	if err != nil {
		res.Detail = err.Error()
		return res
	}
	defer ag.stop(5 * time.Second)
	t := time.NewTimer(20 * time.Second)
	defer t.Stop()
	select {
	case <-ag.done:
	case <-t.C:
		res.Detail = "the agent did not exit within 20 s"
		if ss, err := r.d.sessions(ctx); err == nil && len(ss) > 0 {
			r.cell.Measured = Measured{Outcome: "compatible", Protocol: ss[len(ss)-1].Protocol, Features: ss[len(ss)-1].Features}
			res.Detail += ": it registered"
		}
		return res
	}
	msg := ""
	for _, l := range strings.Split(ag.stderr.String(), "\n") {
		if m, ok := strings.CutPrefix(l, "forgeyard-agent: "); ok {
			msg = m
		}
	}
	r.cell.Measured = Measured{Outcome: "rejected", Rejection: msg}
	if ag.exitCode() != 1 || msg != r.cell.Expected.Rejection {
		res.Detail = fmt.Sprintf("agent exit %d with %q; want exit 1 with %q", ag.exitCode(), msg, r.cell.Expected.Rejection)
		return res
	}
	if ss, err := r.d.sessions(ctx); err != nil || len(ss) != 0 {
		res.Detail = fmt.Sprintf("sessions after the refusal: %v %v", ss, err)
		return res
	}
	res.Pass = true
	return res
}
