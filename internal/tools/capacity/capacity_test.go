package capacity

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/tools/loadgen"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/logs"
)

const inputsFile = "../../../docs/perf/capacity-inputs.json"

func loadInputs(t *testing.T) *Inputs {
	t.Helper()
	in, err := LoadInputs(inputsFile)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// The checked-in inputs are exactly what `capacity import` makes of the
// measurements they cite: nobody edited a figure by hand, and a new ladder
// table in docs/perf.md without a re-import is caught here.
func TestInputsAreTheImportOfTheirSources(t *testing.T) {
	in := loadInputs(t)
	var got Inputs
	for _, src := range in.Sources {
		if src.File == "" || src.Commit == "" || src.Command == "" {
			t.Errorf("source %q lacks file, commit or command", src.What)
			continue
		}
		f, err := os.Open(filepath.Join("../../..", src.File))
		if err != nil {
			t.Fatal(err)
		}
		switch src.Command {
		case "make scale":
			pts, s, err := ParseScaleTable(f)
			if err != nil {
				t.Fatal(err)
			}
			if s.Commit != src.Commit || s.Date != src.Date {
				t.Errorf("%s now holds the ladder of commit %s (%s), the inputs cite %s (%s): run `make capacity-inputs`", src.File, s.Commit, s.Date, src.Commit, src.Date)
			}
			got.Ladder = pts
		case "make bench-authority":
			pts, fleet, err := ParseAuthorityBench(f)
			if err != nil {
				t.Fatal(err)
			}
			got.Authority, got.RenewFleet = pts, fleet
		default:
			t.Errorf("source %q: unknown command %q", src.What, src.Command)
		}
		f.Close()
	}
	if !reflect.DeepEqual(got.Ladder, in.Ladder) {
		t.Errorf("ladder points differ from %s's table: run `make capacity-inputs`\nimported %+v\nchecked in %+v", inputsFile, got.Ladder, in.Ladder)
	}
	if !reflect.DeepEqual(got.Authority, in.Authority) || !reflect.DeepEqual(got.RenewFleet, in.RenewFleet) {
		t.Errorf("authority points differ from the benchmark output: run `make capacity-inputs`")
	}
}

// The model's stated tolerances for predicting a ladder point it was not
// fitted on.
const (
	rssTolerance = 0.10
	cpuTolerance = 0.10
)

// Leave one out: fit memory and CPU on all but one ladder point of a
// backend and predict the one left out. This is the check of the model
// against measured points docs/capacity.md reports; it fails when the
// per-agent costs stop being linear in N within the tolerances.
func TestLadderLeaveOneOut(t *testing.T) {
	in := loadInputs(t)
	checked := 0
	for _, backend := range []string{"quic", "yamux", "webtransport"} {
		var pts []LadderPoint
		for _, p := range in.Ladder {
			if p.Backend == backend {
				pts = append(pts, p)
			}
		}
		if len(pts) < 3 {
			t.Logf("%s: %d ladder points, leave-one-out needs 3", backend, len(pts))
			continue
		}
		for _, out := range pts {
			f, err := FitBackend(in, backend, func(p LadderPoint) bool { return p.Step != out.Step })
			if err != nil {
				t.Fatal(err)
			}
			n := float64(out.N)
			rss := f.RSS(n) / n
			cpu := f.CPU(n) * 1000 / n
			rssErr := rss/out.RSSPerAgentBytes - 1
			cpuErr := cpu/out.CPUPercentPer1000 - 1
			t.Logf("%s predicted from %v: RSS %.1f KiB/agent (measured %.1f, %+.1f %%), CPU %.2f %%/1,000 (measured %.2f, %+.1f %%)",
				out.Step, f.Points, rss/1024, out.RSSPerAgentBytes/1024, rssErr*100, cpu, out.CPUPercentPer1000, cpuErr*100)
			if math.Abs(rssErr) > rssTolerance {
				t.Errorf("%s: RSS per agent predicted %.0f B, measured %.0f B: off by %.1f %% > %.0f %%", out.Step, rss, out.RSSPerAgentBytes, rssErr*100, rssTolerance*100)
			}
			if math.Abs(cpuErr) > cpuTolerance {
				t.Errorf("%s: CPU per 1,000 predicted %.2f %%, measured %.2f %%: off by %.1f %% > %.0f %%", out.Step, cpu, out.CPUPercentPer1000, cpuErr*100, cpuTolerance*100)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no backend has 3 ladder points: nothing was checked")
	}
}

// The model says a load under the measured renew ceiling is carried; the
// RenewFleet runs offered 1,000 renewals/s (10,000 agents every 10 s):
// where the model puts that under the ceiling, the runs kept up.
func TestRenewFleetAgreesWithCeiling(t *testing.T) {
	in := loadInputs(t)
	const offered = 10000 / 10.0 // BenchmarkRenewFleet: agentsN / interval
	stores := map[string][]float64{}
	for _, r := range in.RenewFleet {
		store := strings.TrimSuffix(r.Store, "-2")
		stores[store] = append(stores[store], r.RenewPerS)
	}
	if len(stores) == 0 {
		t.Fatal("no RenewFleet runs in the inputs")
	}
	for store, runs := range stores {
		c, ok := in.AuthorityCeiling(store, "renew", 512)
		if !ok {
			t.Fatalf("no renew ceiling for %s", store)
		}
		util := offered / c.OpsPerS
		best := 0.0
		for _, v := range runs {
			best = math.Max(best, v)
		}
		t.Logf("%s: model utilization %.0f %% of the renew ceiling %.0f/s; runs achieved %v/s", store, util*100, c.OpsPerS, runs)
		if util < 1 && best < 0.97*offered {
			t.Errorf("%s: the model puts %.0f renewals/s at %.0f %% of the ceiling, but no run reached 97 %% of it (%v)", store, offered, util*100, runs)
		}
	}
}

// The discrete-event simulation's mean load equals the model's
// (operation rates × costs) within the Poisson noise, is deterministic,
// and a restart herd concentrates the load.
func TestSimulationAgreesWithModel(t *testing.T) {
	m, err := New(loadInputs(t), DefaultWorkload(), DefaultDeployment())
	if err != nil {
		t.Fatal(err)
	}
	k := 16
	cfg := SimConfig{K: k, HorizonS: 300, Seed: 7}
	a, err := m.Simulate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := m.Simulate(cfg)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("the simulation is not deterministic: %+v vs %+v", a, b)
	}
	want := m.Evaluate(k).DBUtil
	t.Logf("100,000 agents on %d daemons: simulated mean %.1f %%, model %.1f %%, busiest second %.1f %%, most queued %.1f s", k, a.MeanUtil*100, want*100, a.Peak1sUtil*100, a.MaxBacklogS)
	if math.Abs(a.MeanUtil/want-1) > 0.03 {
		t.Errorf("simulated mean utilization %.3f, model %.3f: more than 3 %% apart", a.MeanUtil, want)
	}
	if want > 1 && a.EndBacklogS < (want-1)*cfg.HorizonS*0.9 {
		t.Errorf("the model is over the ceiling (%.2f) but the queue did not grow by the excess: %.1f s", want, a.EndBacklogS)
	}
	h, err := m.Simulate(SimConfig{K: k, HorizonS: 300, Seed: 7, Herd: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("herd: busiest second %.1f %%, registrations over %.0f s", h.Peak1sUtil*100, h.RegWindowS)
	if h.Peak1sUtil <= a.Peak1sUtil {
		t.Errorf("a restart herd's busiest second (%.3f) should exceed the steady one's (%.3f)", h.Peak1sUtil, a.Peak1sUtil)
	}
	if got, want := h.Ops["register (+resync)"], m.W.Agents; got != want {
		t.Errorf("herd: %d registrations simulated, want one per agent (%d)", got, want)
	}
}

// Size's answer is consistent with Evaluate: at MinK every per-daemon
// resource is under the target, at MinK−1 one is not.
func TestSizeIsTheLeastK(t *testing.T) {
	m, err := New(loadInputs(t), DefaultWorkload(), DefaultDeployment())
	if err != nil {
		t.Fatal(err)
	}
	s := m.Size()
	if s.MinK < 2 {
		t.Fatalf("MinK = %d; the reference workload needs several daemons", s.MinK)
	}
	over := func(k int) []string {
		var names []string
		for _, x := range m.Evaluate(k).Resources {
			if !x.Shared && x.Capacity > 0 && x.Util() > m.D.TargetUtil {
				names = append(names, x.Name)
			}
		}
		return names
	}
	if o := over(s.MinK); len(o) > 0 {
		t.Errorf("at k=%d %v are over the target", s.MinK, o)
	}
	if o := over(s.MinK - 1); len(o) == 0 {
		t.Errorf("k=%d already keeps every resource under the target; MinK=%d is not the least", s.MinK-1, s.MinK)
	}
	if s.PerResourceK[s.Bound] != s.MinK {
		t.Errorf("bound %q needs k=%d, MinK=%d", s.Bound, s.PerResourceK[s.Bound], s.MinK)
	}
	// MaxAgents agrees with Evaluate at its edge.
	mx := m.MaxAgents(s.MinK)
	for i, x := range m.Evaluate(s.MinK).Resources {
		v := mx[x.Name]
		if v <= 0 {
			continue
		}
		mm := *m
		mm.W.Agents = int(v) + 1
		if u := mm.Evaluate(s.MinK).Resources[i].Util(); u <= m.D.TargetUtil {
			t.Errorf("%s: MaxAgents %v, but %v agents are still at %.3f", x.Name, v, v+1, u)
		}
	}
}

// The model's copies of the code's constants are the code's.
func TestDefaultsMatchCode(t *testing.T) {
	w := DefaultWorkload()
	sec := func(d time.Duration) float64 { return d.Seconds() }
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"heartbeat interval", w.HeartbeatIntervalS, sec(daemon.DefaultHeartbeatInterval)},
		{"max heartbeat interval", w.MaxHeartbeatIntervalS, sec(daemon.DefaultMaxHeartbeatInterval)},
		{"heartbeat budget", w.MaxHeartbeatsPerSecond, daemon.DefaultMaxHeartbeatsPerSecond},
		{"renew interval", w.RenewIntervalS, sec(daemon.DefaultRenewInterval)},
		{"dedup retention", w.DedupRetentionH, daemon.DefaultDedupRetention.Hours()},
		{"log ack interval", logAckIntervalS, sec(logs.DefaultAckInterval)},
		{"log ack bytes", logAckBytes, logs.DefaultAckBytes},
		{"CAS chunk", casChunkBytes, cas.DefaultChunkSize},
	} {
		if c.got != c.want {
			t.Errorf("%s: model %v, code %v", c.name, c.got, c.want)
		}
	}
}

func TestParseAuthorityBench(t *testing.T) {
	out := `goos: linux
BenchmarkGroupCommit/postgres-fsync/renew/callers=512-2   5000   1 ns/op   1300 ops/s
BenchmarkGroupCommit/postgres-fsync/renew/callers=512-2   5000   1 ns/op   1900 ops/s
BenchmarkGroupCommit/postgres-fsync/renew/callers=512-2   5000   1 ns/op   1800 ops/s
BenchmarkRenewFleet/sqlite-full-2   1   10001855037 ns/op   1.000 lag-ms   69.83 p99-ms   999.8 renewals/s
PASS`
	pts, fleet, err := ParseAuthorityBench(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	want := []AuthorityPoint{{Store: "postgres-fsync", Op: "renew", Callers: 512, OpsPerS: 1800, Runs: 3, MinOps: 1300, MaxOps: 1900}}
	if !reflect.DeepEqual(pts, want) {
		t.Errorf("points %+v, want %+v", pts, want)
	}
	if len(fleet) != 1 || fleet[0].Store != "sqlite-full" || fleet[0].RenewPerS != 999.8 || fleet[0].P99Ms != 69.83 || fleet[0].LagMs != 1 {
		t.Errorf("fleet %+v", fleet)
	}
	if _, _, err := ParseAuthorityBench(strings.NewReader("PASS\n")); err == nil {
		t.Error("no benchmark lines: want an error")
	}
}

func TestParseScaleTableRejectsRaggedRows(t *testing.T) {
	table := "| step | daemon RSS per agent | CPU per 1,000 agents | all registered | result |\n|---|---|---|---|---|\n| quic:10 | 1.0 KiB | 5% | ok |\n"
	if _, _, err := ParseScaleTable(strings.NewReader(table)); err == nil || !strings.Contains(err.Error(), "cells") {
		t.Error("a row with a missing cell: want an error")
	}
	if _, _, err := ParseScaleTable(strings.NewReader("no table\n")); err == nil {
		t.Error("no table: want an error")
	}
	renamed := "| step | RSS | CPU per 1,000 agents | all registered | result |\n|---|---|---|---|---|\n| quic:10 | 1.0 KiB | 5% | 1 s | ok |\n"
	if _, _, err := ParseScaleTable(strings.NewReader(renamed)); err == nil || !strings.Contains(err.Error(), "daemon RSS per agent") {
		t.Errorf("a renamed column: want an error naming it, got %v", err)
	}
	noHeader := "| step | daemon RSS per agent | CPU per 1,000 agents | all registered | result |\n|---|---|---|---|---|\n| quic:10 | 1.0 KiB | 5% | 1 s | ok |\n"
	if _, _, err := ParseScaleTable(strings.NewReader(noHeader)); err == nil || !strings.Contains(err.Error(), "provenance") {
		t.Errorf("no provenance line: want an error, got %v", err)
	}
	good := "<!-- forgeyard-loadgen ladder \"quic:10\", 2026-12-02T00:00:00Z, commit abc1234; heartbeat 10s, 20 leases/s, steady window 30s -->\n\n" + noHeader
	pts, src, err := ParseScaleTable(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	if src.Commit != "abc1234" || len(pts) != 1 || pts[0].RSSPerAgentBytes != 1024 || pts[0].CPUPercentPer1000 != 5 || pts[0].AllRegisteredS != 1 ||
		!pts[0].OK || pts[0].HeartbeatIntervalS != 10 || pts[0].LeaseRatePerS != 20 {
		t.Errorf("parsed %+v from %+v", pts, src)
	}
}

// A real loadgen summary (its JSON tags) reads into a ladder point.
func TestParseLoadgenJSON(t *testing.T) {
	s := loadgen.Summary{Backend: "quic", N: 1234, HeartbeatInterval: 10 * time.Second, LeaseRate: 20}
	s.Cold.Took = 3 * time.Second
	s.Cold.PeakPerSecond = 400
	s.Cold.AttemptsPerAgent.Mean = 1.5
	s.Daemon.RSSPerAgent = 200000
	s.Daemon.CPUPercentPer1000 = 12.5
	s.Daemon.FDs = 42
	s.Steady.HeartbeatP50 = 2 * time.Millisecond
	s.Raw = &loadgen.RawResult{RSSPerConn: 80000}
	var buf bytes.Buffer
	if err := s.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	p, err := ParseLoadgenJSON(&buf)
	if err != nil {
		t.Fatal(err)
	}
	want := LadderPoint{Step: "quic:1234", Backend: "quic", N: 1234, OK: true, Result: "ok", RSSPerAgentBytes: 200000, RawRSSPerConnBytes: 80000,
		CPUPercentPer1000: 12.5, HeartbeatP50Ms: 2, AllRegisteredS: 3, PeakRegPerS: 400, AttemptsPerAgent: 1.5, HeartbeatIntervalS: 10, LeaseRatePerS: 20, FDs: 42}
	if !reflect.DeepEqual(p, want) {
		t.Errorf("got  %+v\nwant %+v", p, want)
	}
}

func TestLoadInputsRejectsBadFiles(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"unknown-field": `{"ladder":[],"authority":[],"bogus":1}`,
		"no-ladder":     `{"ladder":[],"authority":[{"store":"s","op":"renew","callers":1,"ops_per_s":1}]}`,
		"zero-cpu":      `{"ladder":[{"step":"quic:1","backend":"quic","n":1,"rss_per_agent_bytes":1,"cpu_percent_per_1000_agents":0}],"authority":[{"store":"s","op":"renew","callers":1,"ops_per_s":1}]}`,
	} {
		p := filepath.Join(dir, name+".json")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadInputs(p); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
}

func TestNewRejectsBadWorkloads(t *testing.T) {
	in := loadInputs(t)
	for name, mod := range map[string]func(*Workload, *Deployment){
		"no agents":         func(w *Workload, _ *Deployment) { w.Agents = 0 },
		"no heartbeat":      func(w *Workload, _ *Deployment) { w.HeartbeatIntervalS = 0 },
		"negative leases":   func(w *Workload, _ *Deployment) { w.LeasesPerAgentHour = -1 },
		"target above 1":    func(_ *Workload, d *Deployment) { d.TargetUtil = 1.5 },
		"no cores":          func(_ *Workload, d *Deployment) { d.DaemonCores = 0 },
		"unknown backend":   func(w *Workload, _ *Deployment) { w.Backend = "carrier-pigeon" },
		"unknown store":     func(_ *Workload, d *Deployment) { d.Store = "mysql" },
		"one ladder point":  func(w *Workload, _ *Deployment) { w.Backend = "yamux" },
		"negative spare":    func(_ *Workload, d *Deployment) { d.Spare = -1 },
		"no admission rate": func(_ *Workload, d *Deployment) { d.RegistrationRate = 0 },
	} {
		w, d := DefaultWorkload(), DefaultDeployment()
		mod(&w, &d)
		if _, err := New(in, w, d); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
	if _, err := New(in, DefaultWorkload(), DefaultDeployment()); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
}
