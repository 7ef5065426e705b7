// Command capacity prints the capacity model of docs/capacity.md from the
// measured inputs, and rebuilds those inputs from fresh measurements.
//
//	go run ./internal/tools/capacity/cmd/capacity model [--agents 100000] [--k 0] [--heartbeat 10s] [--leases-per-hour 2] [--json]
//	go run ./internal/tools/capacity/cmd/capacity sensitivity
//	go run ./internal/tools/capacity/cmd/capacity simulate --k 15 [--herd]
//	go run ./internal/tools/capacity/cmd/capacity import --scale out/scale.md --authority docs/perf/authority-bench.txt \
//	    --authority-commit C --authority-date D [--loadgen-json run.json ...] > docs/perf/capacity-inputs.json
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"forgeyard.dev/transport/internal/tools/capacity"
)

const defaultInputs = "docs/perf/capacity-inputs.json"

func main() {
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "model":
		err = cmdModel(os.Args[2:], os.Stdout)
	case "sensitivity":
		err = cmdSensitivity(os.Args[2:], os.Stdout)
	case "simulate":
		err = cmdSimulate(os.Args[2:], os.Stdout)
	case "import":
		err = cmdImport(os.Args[2:], os.Stdout)
	case "-h", "--help", "help":
		usage(os.Stdout)
		return
	default:
		usage(os.Stderr)
		os.Exit(2)
	}
	if err != nil {
		msg := err.Error()
		if !strings.HasPrefix(msg, "capacity:") {
			msg = "capacity: " + msg
		}
		fmt.Fprintln(os.Stderr, msg)
		os.Exit(1)
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: capacity model|sensitivity|simulate|import [flags]   (docs/capacity.md)")
}

type common struct {
	inputs string
	w      capacity.Workload
	d      capacity.Deployment
	hb     time.Duration
}

func addCommon(fs *flag.FlagSet) *common {
	c := &common{w: capacity.DefaultWorkload(), d: capacity.DefaultDeployment()}
	fs.StringVar(&c.inputs, "inputs", defaultInputs, "measured inputs (JSON; `capacity import` writes it)")
	fs.IntVar(&c.w.Agents, "agents", c.w.Agents, "agents in the fleet")
	fs.StringVar(&c.w.Backend, "backend", c.w.Backend, "backend whose ladder points give the per-agent costs: quic, yamux, webtransport")
	fs.Float64Var(&c.w.LeasesPerAgentHour, "leases-per-hour", c.w.LeasesPerAgentHour, "attempts per agent per hour")
	fs.Float64Var(&c.w.AttemptSeconds, "attempt-seconds", c.w.AttemptSeconds, "mean attempt duration, seconds")
	fs.Float64Var(&c.w.LogBytesPerAttempt, "log-bytes", c.w.LogBytesPerAttempt, "log bytes per attempt")
	fs.Float64Var(&c.w.LogActiveSeconds, "log-active-seconds", c.w.LogActiveSeconds, "seconds an attempt keeps writing log output")
	fs.Float64Var(&c.w.OutputsPerAttempt, "outputs", c.w.OutputsPerAttempt, "outputs (CAS objects) per attempt")
	fs.Float64Var(&c.w.OutputBytes, "output-bytes", c.w.OutputBytes, "mean bytes of one output")
	fs.DurationVar(&c.hb, "heartbeat", 10*time.Second, "timing.heartbeat_interval")
	fs.Float64Var(&c.w.MaxHeartbeatsPerSecond, "max-heartbeats-per-second", c.w.MaxHeartbeatsPerSecond, "timing.max_heartbeats_per_second (per daemon; -1: none)")
	fs.Float64Var(&c.d.DaemonCores, "daemon-cores", c.d.DaemonCores, "cores of a daemon host")
	fs.Float64Var(&c.d.DaemonMemoryBytes, "daemon-memory", c.d.DaemonMemoryBytes, "memory of a daemon host, bytes")
	fs.IntVar(&c.d.Spare, "spare", c.d.Spare, "daemons that may be down (their agents spread over the rest)")
	fs.Float64Var(&c.d.TargetUtil, "target-util", c.d.TargetUtil, "highest utilization allowed for any resource")
	fs.StringVar(&c.d.Store, "store", c.d.Store, "authority benchmark store whose ceilings apply: postgres-fsync, sqlite-full")
	fs.Float64Var(&c.d.S3PutPerS, "s3-put-per-s", c.d.S3PutPerS, "object store PUT budget (0: not a bound)")
	fs.Float64Var(&c.d.RecoverTargetS, "recover-target", c.d.RecoverTargetS, "seconds within which a daemon's agents must be registered again")
	return c
}

// parse parses args with fs (which has c's flags) and builds the model.
func (c *common) parse(fs *flag.FlagSet, args []string) (*capacity.Model, error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	in, err := capacity.LoadInputs(c.inputs)
	if err != nil {
		return nil, err
	}
	c.w.HeartbeatIntervalS = c.hb.Seconds()
	return capacity.New(in, c.w, c.d)
}

func cmdModel(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("model", flag.ContinueOnError)
	c := addCommon(fs)
	k := fs.Int("k", 0, "daemons (0: the least that keeps every resource under --target-util)")
	asJSON := fs.Bool("json", false, "print JSON")
	m, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	s := m.Size()
	r := s.At
	if *k > 0 {
		r = m.Evaluate(*k)
	}
	if *asJSON {
		e := json.NewEncoder(out)
		e.SetIndent("", "  ")
		return e.Encode(struct {
			Fit    capacity.Fit       `json:"fit"`
			Sizing capacity.Sizing    `json:"sizing"`
			Result capacity.Result    `json:"result"`
			Max    map[string]float64 `json:"max_agents"`
		}{m.Fit, s, r, m.MaxAgents(r.K)})
	}
	printModel(out, m, s, r)
	return nil
}

func printModel(out io.Writer, m *capacity.Model, s capacity.Sizing, r capacity.Result) {
	f := m.Fit
	fmt.Fprintf(out, "Fit (%s, ladder N = %v): RSS %.1f KiB per agent; CPU %.1f %% + %.2f %% per 1,000 agents of one core (heartbeat %.0f s, %.0f leases/s)\n\n",
		f.Backend, f.Points, f.RSSPerAgent/1024, f.CPUFixed, f.CPUPerAgent*1000, f.HeartbeatS, f.LeaseRate)
	w := m.W
	fmt.Fprintf(out, "Workload: %d agents, %.3g attempts/agent/h of %.0f s (%.1f attempts/s, %.0f live leases), log %s over %.0f s, %.3g outputs × %s; %s heartbeat budget %.0f/s per daemon\n",
		w.Agents, w.LeasesPerAgentHour, w.AttemptSeconds, r.AttemptsPerS, r.LiveLeases, human(w.LogBytesPerAttempt), w.LogActiveSeconds, w.OutputsPerAttempt, human(w.OutputBytes), (time.Duration(w.HeartbeatIntervalS * 1e9)).String(), w.MaxHeartbeatsPerSecond)
	fmt.Fprintf(out, "Deployment: %.0f cores, %s per daemon; %d spare; target utilization %.0f %%; authority %s at %d callers\n\n",
		m.D.DaemonCores, human(m.D.DaemonMemoryBytes), m.D.Spare, m.D.TargetUtil*100, m.D.Store, m.D.DBCallers)
	if s.MinK > 0 {
		fmt.Fprintf(out, "Answer: k = %d daemons for the per-daemon resources (decided by: %s)\n", s.MinK, s.Bound)
	} else {
		fmt.Fprintf(out, "Answer: no k ≤ %d keeps every per-daemon resource under %.0f %%\n", m.D.MaxK, m.D.TargetUtil*100)
	}
	if len(s.SharedOver) > 0 {
		fmt.Fprintf(out, "Bounds first: %s, shared, above %.0f %% at any k (more daemons do not help)\n", strings.Join(s.SharedOver, "; "), m.D.TargetUtil*100)
	} else {
		fmt.Fprintf(out, "The shared resources stay under %.0f %%: the first bound is %s\n", m.D.TargetUtil*100, s.Bound)
	}
	var names []string
	for n := range s.PerResourceK {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return s.PerResourceK[names[i]] > s.PerResourceK[names[j]] })
	fmt.Fprintf(out, "Least k per per-daemon resource:")
	for _, n := range names {
		fmt.Fprintf(out, " %s %d;", n, s.PerResourceK[n])
	}
	fmt.Fprintf(out, "\n\nAt k = %d (%.0f agents per daemon with %d down, heartbeat every %.0f s):\n\n", r.K, r.AgentsPerDmn, m.D.Spare, r.HeartbeatS)
	maxA := m.MaxAgents(r.K)
	fmt.Fprintln(out, "| resource | scope | load | capacity | utilization | most agents at the target |")
	fmt.Fprintln(out, "| --- | --- | ---: | ---: | ---: | ---: |")
	for _, x := range r.Resources {
		scope := "per daemon"
		if x.Shared {
			scope = "shared"
		}
		util, capS, most := "-", "-", "-"
		if x.Capacity > 0 {
			util = fmt.Sprintf("%.0f %%", x.Util()*100)
			capS = unit(x.Capacity, x.Unit)
		}
		if v := maxA[x.Name]; v >= 0 {
			most = fmt.Sprintf("%.0f", v)
		} else if x.Capacity > 0 {
			most = "> 10⁸"
		}
		note := ""
		if x.Note != "" {
			note = " (" + x.Note + ")"
		}
		fmt.Fprintf(out, "| %s%s | %s | %s | %s | %s | %s |\n", x.Name, note, scope, unit(x.Load, x.Unit), capS, util, most)
	}
	fmt.Fprintf(out, "\nAuthority operations (PostgreSQL statements and row writes counted from semantics/authority):\n\n")
	fmt.Fprintln(out, "| operation | per s | measured ceiling (benchmark case) | share of the database | statements | row writes |")
	fmt.Fprintln(out, "| --- | ---: | ---: | ---: | ---: | ---: |")
	for _, o := range r.DBOps {
		b := ""
		if o.Batched {
			b = ", group commit"
		}
		fmt.Fprintf(out, "| %s%s | %.0f | %.0f/s (%s) | %.0f %% | %.0f | %.0f |\n", o.Op, b, o.PerS, o.CeilingPerS, o.CeilingOp, o.PerS/o.CeilingPerS*100, o.Statements, o.RowWrites)
	}
	fmt.Fprintf(out, "| total | %.0f (at most this many commits/s) | | **%.0f %%** | %.0f/s | %.0f/s |\n", r.DBTxUpperS, r.DBUtil*100, r.DBStatementsS, r.DBRowWritesS)
	db := r.DB
	fmt.Fprintf(out, "\nDatabase size: rows of %.0f B (lease + indexes), %.0f B (completion), %.0f B (dedup), %.0f B (session); steady %s (%.3g dedup rows within %.0f h), growth %s/day (%.3g leases/day, never deleted): %s after 30 days, %s after a year\n",
		db.LeaseBytes, db.CompletionBytes, db.DedupBytes, db.SessionBytes, human(db.SteadyBytes), db.DedupRows, m.W.DedupRetentionH, human(db.GrowthPerDay), db.RowsPerDay, human(db.After30Days), human(db.After365Days))
	o := r.Object
	fmt.Fprintf(out, "Object store: %s/s in, %s stored within %.0f days; %.0f PUT/s (%.0f of them log segments: %.0f per attempt), %.0f other requests/s\n",
		human(o.BytesPerS), human(o.StoredBytes), o.RetentionDays, o.PutPerS, o.LogPutPerS, o.SegmentsPerAtt, o.OtherReqPerS)
	if r.ColdExtrapol {
		fmt.Fprintln(out, "Note: the re-registration time is extrapolated beyond the measured ladder.")
	}
}

func unit(v float64, u string) string {
	switch u {
	case "bytes":
		return human(v)
	case "bit/s":
		return fmt.Sprintf("%.3g Mbit/s", v/1e6)
	case "% of a core", "% of measured ceiling":
		return fmt.Sprintf("%.0f %%", v)
	}
	return fmt.Sprintf("%.0f %s", v, u)
}

func human(b float64) string {
	switch {
	case b >= 1<<40:
		return fmt.Sprintf("%.1f TiB", b/(1<<40))
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", b/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}

func cmdSensitivity(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("sensitivity", flag.ContinueOnError)
	c := addCommon(fs)
	base, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	type scen struct {
		name string
		mod  func(*capacity.Model)
	}
	scens := []scen{
		{"reference workload", func(*capacity.Model) {}},
		{"heartbeat every 30 s", func(m *capacity.Model) { m.W.HeartbeatIntervalS = 30 }},
		{"leases 10× more frequent (20/agent/h, 1 min each)", func(m *capacity.Model) {
			m.W.LeasesPerAgentHour *= 10
			m.W.AttemptSeconds /= 10
			m.W.LogActiveSeconds /= 10
		}},
		{"leases 10× more frequent, same duration (agents run 3 at once)", func(m *capacity.Model) { m.W.LeasesPerAgentHour *= 10 }},
		{"renew every 30 s (lease_ttl ≥ 90 s)", func(m *capacity.Model) { m.W.RenewIntervalS = 30 }},
		{"logs written in 10 s bursts", func(m *capacity.Model) { m.W.LogActiveSeconds = 10 }},
		{"no spare daemon", func(m *capacity.Model) { m.D.Spare = 0 }},
		{"8-core, 32 GiB daemon hosts (CPU assumed to scale with cores: unmeasured)", func(m *capacity.Model) {
			m.D.DaemonCores, m.D.DaemonMemoryBytes = 8, 32<<30
		}},
	}
	fmt.Fprintln(out, "| scenario | least k (per-daemon resources) | per-daemon bound | bounds first | agents/daemon | database: % of measured ceiling (× needed for the target) | DB ops/s | DB growth/day | object PUT/s | object store, 30 days |")
	fmt.Fprintln(out, "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, sc := range scens {
		m := *base
		sc.mod(&m)
		s := m.Size()
		k := "none"
		if s.MinK > 0 {
			k = fmt.Sprint(s.MinK)
		}
		r := s.At
		fmt.Fprintf(out, "| %s | %s | %s | %s | %.0f | %.0f %% (%.1f×) | %.0f | %s | %.0f | %s |\n", sc.name, k, s.Bound, s.First(), r.AgentsPerDmn, r.DBUtil*100,
			r.DBUtil/m.D.TargetUtil, r.DBTxUpperS, human(r.DB.GrowthPerDay), r.Object.PutPerS, human(r.Object.BytesPerS*30*86400))
	}
	return nil
}

func cmdSimulate(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	c := addCommon(fs)
	k := fs.Int("k", 15, "daemons")
	horizon := fs.Duration("horizon", 10*time.Minute, "simulated time")
	seed := fs.Uint64("seed", 1, "random seed")
	herd := fs.Bool("herd", false, "every daemon restarted at 0: agents register again at admission.registration_rate")
	m, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	res, err := m.Simulate(capacity.SimConfig{K: *k, HorizonS: horizon.Seconds(), Seed: *seed, Herd: *herd})
	if err != nil {
		return err
	}
	ev := m.Evaluate(*k)
	mode := "steady (random phases)"
	if *herd {
		mode = fmt.Sprintf("herd (all %d daemons restarted at 0; last registration at %.0f s)", *k, res.RegWindowS)
	}
	fmt.Fprintf(out, "%d agents on %d daemons, %s, %s simulated, seed %d\n", m.W.Agents, *k, mode, *horizon, *seed)
	fmt.Fprintf(out, "database utilization: mean %.0f %% (model %.0f %%), busiest second %.0f %%, most work queued %.2f s, queued at the end %.2f s\n",
		res.MeanUtil*100, ev.DBUtil*100, res.Peak1sUtil*100, res.MaxBacklogS, res.EndBacklogS)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	var ops []string
	for o := range res.Ops {
		ops = append(ops, o)
	}
	sort.Strings(ops)
	for _, o := range ops {
		fmt.Fprintf(tw, "  %s\t%d\t%.0f/s\n", o, res.Ops[o], float64(res.Ops[o])/horizon.Seconds())
	}
	return tw.Flush()
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

func cmdImport(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("import", flag.ContinueOnError)
	scale := fs.String("scale", "", "the ladder's Markdown table (out/scale.md, or docs/perf.md)")
	var jsons multi
	fs.Var(&jsons, "loadgen-json", "a `forgeyard-loadgen run --json` summary (repeatable; replaces the table's point of the same step)")
	auth := fs.String("authority", "", "`make bench-authority` output (go test -bench text)")
	authCommit := fs.String("authority-commit", "", "commit the authority benchmark ran at")
	authDate := fs.String("authority-date", "", "date of the authority benchmark")
	jsonCommit := fs.String("loadgen-commit", "", "commit the --loadgen-json runs ran at")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var in capacity.Inputs
	if *scale != "" {
		var pts []capacity.LadderPoint
		var src capacity.Source
		if err := readFile(*scale, func(r io.Reader) (err error) {
			pts, src, err = capacity.ParseScaleTable(r)
			return err
		}); err != nil {
			return err
		}
		src.File = *scale
		in.Sources = append(in.Sources, src)
		in.Ladder = pts
	}
	for _, j := range jsons {
		var p capacity.LadderPoint
		if err := readFile(j, func(r io.Reader) (err error) {
			if p, err = capacity.ParseLoadgenJSON(r); err != nil {
				return fmt.Errorf("%s: %w", j, err)
			}
			return nil
		}); err != nil {
			return err
		}
		replaced := false
		for i := range in.Ladder {
			if in.Ladder[i].Backend == p.Backend && in.Ladder[i].N == p.N {
				in.Ladder[i], replaced = p, true
			}
		}
		if !replaced {
			in.Ladder = append(in.Ladder, p)
		}
		in.Sources = append(in.Sources, capacity.Source{What: "loadgen run " + p.Step, Commit: *jsonCommit, Command: "forgeyard-loadgen run --json", File: j})
	}
	if *auth != "" {
		if err := readFile(*auth, func(r io.Reader) (err error) {
			in.Authority, in.RenewFleet, err = capacity.ParseAuthorityBench(r)
			return err
		}); err != nil {
			return err
		}
		in.Sources = append(in.Sources, capacity.Source{What: "authority group commit and RenewFleet", Commit: *authCommit, Date: *authDate,
			Command: "make bench-authority", File: *auth})
	}
	if err := in.Validate(); err != nil {
		return err
	}
	return in.WriteJSON(out)
}

// readFile opens path and hands it to read.
func readFile(path string, read func(io.Reader) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return read(f)
}
