package capacity

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Inputs are the measured figures the model is built from, each set with
// where it came from. Its JSON form is checked in as
// docs/perf/capacity-inputs.json and rebuilt by `capacity import` from the
// ladder's table (out/scale.md), loadgen --json summaries and the
// authority benchmark's output.
type Inputs struct {
	// Sources say where each part was measured (commit, date, command).
	Sources []Source `json:"sources"`
	// Ladder is one point per ladder step: N real agents on one daemon.
	Ladder []LadderPoint `json:"ladder"`
	// Authority is the group-commit benchmark: medians per store, operation
	// and caller count, and the RenewFleet runs.
	Authority  []AuthorityPoint `json:"authority"`
	RenewFleet []RenewFleetRun  `json:"renew_fleet,omitempty"`
}

// Source is the provenance of a part of the inputs.
type Source struct {
	What    string `json:"what"`
	Commit  string `json:"commit"`
	Date    string `json:"date"`
	Command string `json:"command"`
	File    string `json:"file,omitempty"`
	Note    string `json:"note,omitempty"`
}

// LadderPoint is one ladder step (docs/perf.md §10).
type LadderPoint struct {
	Step    string `json:"step"`
	Backend string `json:"backend"`
	N       int    `json:"n"`
	// OK is false when the step failed (its figures are still measured,
	// but Fit leaves it out unless asked).
	OK     bool   `json:"ok"`
	Result string `json:"result,omitempty"`

	RSSPerAgentBytes   float64 `json:"rss_per_agent_bytes"`
	RawRSSPerConnBytes float64 `json:"raw_rss_per_conn_bytes,omitempty"`
	HeapPerAgentBytes  float64 `json:"heap_per_agent_bytes,omitempty"`
	// CPUPercentPer1000 is % of one core per 1,000 agents over the steady
	// window (heartbeats and the ladder's lease rate).
	CPUPercentPer1000 float64 `json:"cpu_percent_per_1000_agents"`
	HeartbeatP50Ms    float64 `json:"heartbeat_p50_ms,omitempty"`
	HeartbeatP99Ms    float64 `json:"heartbeat_p99_ms,omitempty"`
	// AllRegisteredS is the cold start: first agent started → N-th
	// agent registered, every agent started at once.
	AllRegisteredS   float64 `json:"all_registered_s,omitempty"`
	PeakRegPerS      float64 `json:"peak_registrations_per_s,omitempty"`
	AttemptsPerAgent float64 `json:"attempts_per_agent,omitempty"`
	// The run's settings.
	HeartbeatIntervalS float64 `json:"heartbeat_interval_s,omitempty"`
	LeaseRatePerS      float64 `json:"lease_rate_per_s,omitempty"`
	FDs                int     `json:"fds,omitempty"` // only from --json summaries
}

// AuthorityPoint is one BenchmarkGroupCommit case: the median over runs.
type AuthorityPoint struct {
	Store   string  `json:"store"` // sqlite-full, postgres-fsync
	Op      string  `json:"op"`    // baseline-insert, complete, complete-unbatched, renew, create
	Callers int     `json:"callers"`
	OpsPerS float64 `json:"ops_per_s"` // median
	Runs    int     `json:"runs"`
	MinOps  float64 `json:"min_ops_per_s"`
	MaxOps  float64 `json:"max_ops_per_s"`
}

// RenewFleetRun is one BenchmarkRenewFleet run.
type RenewFleetRun struct {
	Store     string  `json:"store"`
	RenewPerS float64 `json:"renewals_per_s"`
	P99Ms     float64 `json:"p99_ms"`
	LagMs     float64 `json:"lag_ms"`
}

// LoadInputs reads an Inputs JSON file.
func LoadInputs(path string) (*Inputs, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var in Inputs
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return nil, fmt.Errorf("capacity: %s: %w", path, err)
	}
	if err := in.Validate(); err != nil {
		return nil, fmt.Errorf("capacity: %s: %w", path, err)
	}
	return &in, nil
}

// Validate checks that the inputs hold what the model needs.
func (in *Inputs) Validate() error {
	if len(in.Ladder) == 0 {
		return fmt.Errorf("no ladder points")
	}
	for _, p := range in.Ladder {
		if p.N <= 0 || p.RSSPerAgentBytes <= 0 || p.CPUPercentPer1000 <= 0 {
			return fmt.Errorf("ladder step %q: n, rss_per_agent_bytes and cpu_percent_per_1000_agents must be > 0", p.Step)
		}
		if p.Backend == "" {
			return fmt.Errorf("ladder step %q: no backend", p.Step)
		}
	}
	if len(in.Authority) == 0 {
		return fmt.Errorf("no authority benchmark points")
	}
	for _, a := range in.Authority {
		if a.OpsPerS <= 0 || a.Store == "" || a.Op == "" {
			return fmt.Errorf("authority point %s/%s/%d: store, op and ops_per_s > 0 needed", a.Store, a.Op, a.Callers)
		}
	}
	return nil
}

// WriteJSON writes the inputs as indented JSON.
func (in *Inputs) WriteJSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(in)
}

// AuthorityCeiling returns the measured median ops/s of store and op at
// the caller count closest to callers (the larger one on a tie), and
// whether there is one.
func (in *Inputs) AuthorityCeiling(store, op string, callers int) (AuthorityPoint, bool) {
	var best AuthorityPoint
	found := false
	for _, a := range in.Authority {
		if a.Store != store || a.Op != op {
			continue
		}
		if !found || absInt(a.Callers-callers) < absInt(best.Callers-callers) ||
			(absInt(a.Callers-callers) == absInt(best.Callers-callers) && a.Callers > best.Callers) {
			best, found = a, true
		}
	}
	return best, found
}

func absInt(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

// benchLine matches a BenchmarkGroupCommit or BenchmarkRenewFleet line.
var (
	groupLine = regexp.MustCompile(`^BenchmarkGroupCommit/([^/]+)/([^/]+)/callers=(\d+)(?:-\d+)?\s+\d+\s+[\d.]+ ns/op\s+([\d.]+) ops/s`)
	fleetLine = regexp.MustCompile(`^BenchmarkRenewFleet/([^\s]+?)(?:-\d+)?\s+\d+\s+[\d.]+ ns/op(.*)$`)
	metricRe  = regexp.MustCompile(`([\d.]+) (\S+)`)
)

// ParseAuthorityBench reads `go test -bench 'GroupCommit|RenewFleet'`
// output (semantics/authority, `make bench-authority`), possibly several
// runs concatenated, and returns the median of each case.
func ParseAuthorityBench(r io.Reader) ([]AuthorityPoint, []RenewFleetRun, error) {
	type key struct {
		store, op string
		callers   int
	}
	samples := map[key][]float64{}
	var fleet []RenewFleetRun
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if m := groupLine.FindStringSubmatch(line); m != nil {
			c, _ := strconv.Atoi(m[3])
			v, err := strconv.ParseFloat(m[4], 64)
			if err != nil {
				return nil, nil, fmt.Errorf("capacity: bench line %q: %w", line, err)
			}
			k := key{m[1], m[2], c}
			samples[k] = append(samples[k], v)
			continue
		}
		if m := fleetLine.FindStringSubmatch(line); m != nil {
			run := RenewFleetRun{Store: m[1]}
			for _, mm := range metricRe.FindAllStringSubmatch(m[2], -1) {
				v, _ := strconv.ParseFloat(mm[1], 64)
				switch mm[2] {
				case "renewals/s":
					run.RenewPerS = v
				case "p99-ms":
					run.P99Ms = v
				case "lag-ms":
					run.LagMs = v
				}
			}
			fleet = append(fleet, run)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, err
	}
	var out []AuthorityPoint
	for k, v := range samples {
		sort.Float64s(v)
		out = append(out, AuthorityPoint{Store: k.store, Op: k.op, Callers: k.callers, OpsPerS: median(v), Runs: len(v), MinOps: v[0], MaxOps: v[len(v)-1]})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Store != b.Store {
			return a.Store < b.Store
		}
		if a.Op != b.Op {
			return a.Op < b.Op
		}
		return a.Callers < b.Callers
	})
	if len(out) == 0 && len(fleet) == 0 {
		return nil, nil, fmt.Errorf("capacity: no BenchmarkGroupCommit or BenchmarkRenewFleet lines")
	}
	return out, fleet, nil
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// ladderHeader is the first line of the ladder's table:
// <!-- forgeyard-loadgen ladder "…", DATE, commit C; heartbeat 10s, 20 leases/s, … -->
var ladderHeader = regexp.MustCompile(`forgeyard-loadgen ladder "([^"]*)", ([^,]+), commit ([0-9a-f]+|\S+); heartbeat ([^,]+), ([\d.]+) leases/s`)

// ParseScaleTable reads the ladder's Markdown table (`make scale` writes
// out/scale.md; docs/perf.md §10 quotes it) and returns its points and the
// provenance its header line gives. Columns are found by their header
// text, so added columns do not break it.
func ParseScaleTable(r io.Reader) ([]LadderPoint, Source, error) {
	var src Source
	var hdr []string
	var out []LadderPoint
	hb, rate := 0.0, 0.0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if m := ladderHeader.FindStringSubmatch(line); m != nil {
			src = Source{What: "fleet-scale ladder " + m[1], Date: m[2], Commit: m[3], Command: "make scale"}
			if d, err := parseDurationS(m[4]); err == nil {
				hb = d
			}
			rate, _ = strconv.ParseFloat(m[5], 64)
			continue
		}
		if !strings.HasPrefix(line, "|") {
			if len(out) > 0 {
				break // the table ended
			}
			continue
		}
		cells := splitRow(line)
		if hdr == nil {
			if len(cells) > 0 && cells[0] == "step" {
				hdr = cells
				for _, need := range scaleColumns {
					if !slices.Contains(hdr, need) {
						return nil, src, fmt.Errorf("capacity: the scale table has no %q column (the model reads it; internal/tools/loadgen writes the table)", need)
					}
				}
			}
			continue
		}
		if len(cells) > 0 && strings.Trim(cells[0], "-: ") == "" {
			continue // the separator row
		}
		if len(cells) != len(hdr) {
			return nil, src, fmt.Errorf("capacity: scale table row %q has %d cells, header %d", line, len(cells), len(hdr))
		}
		col := func(name string) string {
			for i, h := range hdr {
				if h == name {
					return cells[i]
				}
			}
			return ""
		}
		p := LadderPoint{Step: cells[0], HeartbeatIntervalS: hb, LeaseRatePerS: rate}
		parts := strings.SplitN(p.Step, ":", 3)
		if len(parts) < 2 {
			return nil, src, fmt.Errorf("capacity: scale table step %q: want backend:N", p.Step)
		}
		p.Backend = parts[0]
		n, err := strconv.Atoi(parts[1])
		if err != nil {
			return nil, src, fmt.Errorf("capacity: scale table step %q: %w", p.Step, err)
		}
		p.N = n
		p.Result = col("result")
		p.OK = p.Result == "ok"
		p.RSSPerAgentBytes = parseBytes(col("daemon RSS per agent"))
		p.RawRSSPerConnBytes = parseBytes(col("raw per conn"))
		p.HeapPerAgentBytes = parseBytes(col("daemon heap per agent"))
		p.CPUPercentPer1000 = parsePercent(col("CPU per 1,000 agents"))
		if a, b, ok := strings.Cut(col("heartbeat p50 / p99 steady"), "/"); ok {
			p.HeartbeatP50Ms, p.HeartbeatP99Ms = parseMs(a), parseMs(b)
		}
		p.AllRegisteredS = parseMs(col("all registered")) / 1000
		p.PeakRegPerS, _ = strconv.ParseFloat(col("peak reg/s"), 64)
		if a, _, ok := strings.Cut(col("attempts/agent (mean, max)"), ","); ok {
			p.AttemptsPerAgent, _ = strconv.ParseFloat(strings.TrimSpace(a), 64)
		}
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		return nil, src, err
	}
	if len(out) == 0 {
		return nil, src, fmt.Errorf("capacity: no ladder table rows (a header row starting with | step |)")
	}
	if src.Commit == "" {
		return nil, src, fmt.Errorf(`capacity: the scale table has no provenance line (<!-- forgeyard-loadgen ladder "…", DATE, commit C; heartbeat H, R leases/s, … -->)`)
	}
	return out, src, nil
}

// scaleColumns are the ladder table's columns the model needs.
var scaleColumns = []string{"step", "daemon RSS per agent", "CPU per 1,000 agents", "all registered", "result"}

func splitRow(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(line, "|")
	line = strings.TrimSuffix(line, "|")
	cells := strings.Split(line, "|")
	for i := range cells {
		cells[i] = strings.TrimSpace(cells[i])
	}
	return cells
}

func num(s string) float64 {
	s = strings.TrimSpace(strings.ReplaceAll(s, ",", ""))
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0
	}
	return v
}

// numberUnit splits "NUMBER UNIT" (unit "" for another shape).
func numberUnit(s string) (float64, string) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return 0, ""
	}
	return num(f[0]), f[1]
}

// parseBytes reads "205.3 KiB", "1.2 MiB", "512 B"; 0 for "-" or junk.
func parseBytes(s string) float64 {
	v, unit := numberUnit(s)
	switch unit {
	case "B":
		return v
	case "KiB":
		return v * 1024
	case "MiB":
		return v * (1 << 20)
	case "GiB":
		return v * (1 << 30)
	}
	return 0
}

func parsePercent(s string) float64 { return num(strings.TrimSuffix(strings.TrimSpace(s), "%")) }

// parseMs reads the ladder's durations ("1.32 ms", "4418 ms", "42.3 s").
// Alike in shape to parseBytes, but its µs case divides: a table of
// factors would round differently (v*0.001 is not v/1000).
func parseMs(s string) float64 {
	v, unit := numberUnit(s)
	switch unit {
	case "ms":
		return v
	case "s":
		return v * 1000
	case "µs", "us":
		return v / 1000
	}
	return 0
}

func parseDurationS(s string) (float64, error) {
	s = strings.TrimSpace(s)
	for _, u := range []struct {
		suf string
		mul float64
	}{{"ms", 0.001}, {"s", 1}, {"m", 60}, {"h", 3600}} {
		if strings.HasSuffix(s, u.suf) {
			v, err := strconv.ParseFloat(strings.TrimSuffix(s, u.suf), 64)
			return v * u.mul, err
		}
	}
	return 0, fmt.Errorf("capacity: duration %q", s)
}

// loadgenSummary is the part of `forgeyard-loadgen run --json` the model
// reads (internal/tools/loadgen.Summary); decoded here so this package does not
// link the load generator.
type loadgenSummary struct {
	Backend           string  `json:"backend"`
	N                 int     `json:"n"`
	HeartbeatInterval int64   `json:"heartbeat_interval_ns"`
	LeaseRate         float64 `json:"lease_rate_per_s"`
	Started           string  `json:"started"`
	Cold              struct {
		Complete         bool    `json:"complete"`
		Took             int64   `json:"took_ns"`
		PeakPerSecond    float64 `json:"peak_registrations_per_s"`
		AttemptsPerAgent struct {
			Mean float64 `json:"mean"`
		} `json:"attempts_per_agent"`
	} `json:"cold_start"`
	Steady struct {
		HeartbeatP50 int64 `json:"heartbeat_p50_ns"`
		HeartbeatP99 int64 `json:"heartbeat_p99_ns"`
	} `json:"steady"`
	Daemon struct {
		RSSPerAgent       float64 `json:"rss_per_agent_bytes"`
		HeapPerAgent      float64 `json:"heap_per_agent_bytes"`
		CPUPercentPer1000 float64 `json:"cpu_percent_per_1000_agents"`
		FDs               int     `json:"fds"`
	} `json:"daemon"`
	Raw *struct {
		RSSPerConn float64 `json:"rss_per_conn_bytes"`
	} `json:"raw"`
	Violations []string `json:"violations"`
}

// ParseLoadgenJSON reads one `forgeyard-loadgen run --json` summary.
func ParseLoadgenJSON(r io.Reader) (LadderPoint, error) {
	var s loadgenSummary
	if err := json.NewDecoder(r).Decode(&s); err != nil {
		return LadderPoint{}, fmt.Errorf("capacity: loadgen summary: %w", err)
	}
	if s.N <= 0 || s.Backend == "" {
		return LadderPoint{}, fmt.Errorf("capacity: loadgen summary without backend and n")
	}
	p := LadderPoint{
		Step: fmt.Sprintf("%s:%d", s.Backend, s.N), Backend: s.Backend, N: s.N,
		OK: len(s.Violations) == 0, Result: "ok",
		RSSPerAgentBytes: s.Daemon.RSSPerAgent, HeapPerAgentBytes: s.Daemon.HeapPerAgent,
		CPUPercentPer1000: s.Daemon.CPUPercentPer1000,
		HeartbeatP50Ms:    float64(s.Steady.HeartbeatP50) / 1e6, HeartbeatP99Ms: float64(s.Steady.HeartbeatP99) / 1e6,
		AllRegisteredS: float64(s.Cold.Took) / 1e9, PeakRegPerS: s.Cold.PeakPerSecond,
		AttemptsPerAgent:   s.Cold.AttemptsPerAgent.Mean,
		HeartbeatIntervalS: float64(s.HeartbeatInterval) / 1e9, LeaseRatePerS: s.LeaseRate, FDs: s.Daemon.FDs,
	}
	if !p.OK {
		p.Result = "FAILED: " + strings.Join(s.Violations, "; ")
	}
	if s.Raw != nil {
		p.RawRSSPerConnBytes = s.Raw.RSSPerConn
	}
	return p, nil
}
