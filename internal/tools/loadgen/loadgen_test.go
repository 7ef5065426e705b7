package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/binaries"
)

func TestMain(m *testing.M) {
	MaybeRawServer() // RawBaseline starts this test binary as the raw server
	code := m.Run()
	binaries.Cleanup()
	os.Exit(code)
}

// buildDaemon builds cmd/forgeyard-daemon once per test binary.
func buildDaemon(t *testing.T) string {
	t.Helper()
	return binaries.Build(t, "forgeyard-daemon")[0]
}

// testOptions is a small fleet against a daemon the loadgen starts, with a
// 1 s heartbeat (the steady window spans two intervals, so each agent
// heartbeats in it) and leases offered throughout.
func testOptions(t *testing.T, backend string, n int) Options {
	return Options{Backend: backend, N: n, Heartbeat: time.Second, Steady: 2500 * time.Millisecond, LeaseRate: 20,
		Timeout: 3 * time.Minute, Dir: t.TempDir(), DaemonBin: buildDaemon(t), SourceAddrs: 4, ShutdownTimeout: 2 * time.Second}
}

func checkRun(t *testing.T, s *Summary, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	var tbl bytes.Buffer
	_ = s.WriteTable(&tbl)
	t.Logf("summary:\n%s", tbl.String())
	if !s.OK() {
		t.Fatalf("violations: %v", s.Violations)
	}
	if !s.Cold.Complete || s.Cold.Pending != 0 {
		t.Errorf("cold start incomplete: %+v", s.Cold)
	}
	if s.Cold.AttemptsPerAgent.Mean < 1 {
		t.Errorf("attempts per agent %v, want ≥ 1", s.Cold.AttemptsPerAgent)
	}
	if s.Leases.Accepted == 0 {
		t.Errorf("no lease accepted: %+v", s.Leases)
	}
	c := s.Completions
	if c.Lost != 0 || c.Duplicated != 0 {
		t.Errorf("completions %+v: want none lost or duplicated", c)
	}
	if int64(c.Accepted) < s.Leases.Accepted {
		t.Errorf("%d completions recorded for %d accepted leases", c.Accepted, s.Leases.Accepted)
	}
	if s.Steady.Heartbeats == 0 || s.Steady.HeartbeatP99 <= 0 {
		t.Errorf("no heartbeat round trips in the steady window: %+v", s.Steady)
	}
	if s.Daemon.RSS <= 0 || s.Daemon.CPUSeconds <= 0 || s.Daemon.Heap <= 0 {
		t.Errorf("daemon figures missing: %+v", s.Daemon)
	}
}

// TestFleet: every agent registers, leases run with logs and outputs, none
// is lost or duplicated, and the JSON summary parses back.
func TestFleet(t *testing.T) {
	for _, b := range []string{"quic", "yamux"} {
		t.Run(b, func(t *testing.T) {
			s, err := Run(context.Background(), testOptions(t, b, 30))
			checkRun(t, s, err)
			var buf bytes.Buffer
			if err := s.WriteJSON(&buf); err != nil {
				t.Fatal(err)
			}
			var back Summary
			if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
				t.Fatalf("JSON summary does not parse: %v\n%s", err, buf.String())
			}
			if back.N != 30 || back.Backend != b || back.Completions != s.Completions || !back.Cold.Complete {
				t.Errorf("JSON round trip: %+v", back)
			}
			var raw map[string]any
			_ = json.Unmarshal(buf.Bytes(), &raw)
			for _, k := range []string{"cold_start", "steady", "daemon", "leases", "completions", "failed_by_reason"} {
				if _, ok := raw[k]; !ok {
					t.Errorf("JSON summary lacks %q", k)
				}
			}
		})
	}
}

// TestDaemonProfiles: with Options.Profile the loadgen starts the daemon
// with /debug/pprof/ on its admin socket and writes CPU profiles of the
// cold start (the daemon's and its own) and the daemon's heap profile
// after the steady window, and the daemon's CPU profile of the steady
// window, all in the pprof format (gzip-compressed protobuf); the cold
// start's CPU seconds of both processes are reported.
func TestDaemonProfiles(t *testing.T) {
	o := testOptions(t, "quic", 5)
	o.Profile = time.Second
	s, err := Run(context.Background(), o)
	checkRun(t, s, err)
	if len(s.Profiles) != 4 {
		t.Fatalf("profiles %v, want the daemon's and the loadgen's herd CPU profiles and the daemon's steady CPU and heap profiles", s.Profiles)
	}
	if s.Cold.DaemonCPU <= 0 || s.Cold.LoadgenCPU <= 0 {
		t.Errorf("cold-start CPU: daemon %v s, loadgen %v s; want both measured", s.Cold.DaemonCPU, s.Cold.LoadgenCPU)
	}
	for _, p := range s.Profiles {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Errorf("%s: %d bytes, not a gzip-compressed profile", p, len(b))
		}
	}
}

// TestKillRestartRecovers: after SIGKILL and an immediate restart every
// agent registers again, and no accepted lease is lost.
func TestKillRestartRecovers(t *testing.T) {
	o := testOptions(t, "quic", 20)
	o.KillRestart, o.GracefulRestart = true, true
	s, err := Run(context.Background(), o)
	checkRun(t, s, err)
	if len(s.Restarts) != 2 {
		t.Fatalf("restarts %+v", s.Restarts)
	}
	for _, r := range s.Restarts {
		// Every agent notices the restart, except one whose link had
		// already dropped before it (a heartbeat miss on a loaded
		// machine: counted in Drops, and it must still register again).
		if !r.Round.Complete || r.Noticed > o.N || r.Noticed+int(s.Drops) < o.N {
			t.Errorf("%s: %+v (drops %d)", r.Kind, r, s.Drops)
		}
	}
}

// TestRawBaseline: the raw servers hold N connections and report memory,
// one for every backend the fleet runs on.
func TestRawBaseline(t *testing.T) {
	p, err := PreparePKI(filepath.Join(t.TempDir(), "pki"), 20)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range Backends {
		t.Run(b, func(t *testing.T) {
			prof := filepath.Join(t.TempDir(), "raw-heap.pprof")
			echo := RawSteady{Interval: 200 * time.Millisecond, Window: time.Second, Size: rawEchoSize, HeapProfile: prof}
			r, err := RawBaseline(context.Background(), b, p, 20, 20, 4, time.Minute, echo)
			if err != nil {
				t.Fatal(err)
			}
			// The steady echo: every connection echoed (about five
			// times each in the window; at least once each however
			// loaded the machine is), and the server counted a goroutine
			// per connection at least (quic-go's or the TLS reader's).
			if r.Echoes < 20 || r.EchoWindow != echo.Window || r.EchoCPUSeconds < 0 {
				t.Errorf("raw %s steady echo: %d echoes in %v, server CPU %.3f s", b, r.Echoes, r.EchoWindow, r.EchoCPUSeconds)
			}
			if fi, err := os.Stat(prof); err != nil || fi.Size() == 0 {
				t.Errorf("raw %s heap profile: %v", b, err)
			}
			if r.GoroutinesPerConn < 1 {
				t.Errorf("raw %s: %.2f goroutines per connection", b, r.GoroutinesPerConn)
			}
			if r.RSSBefore <= 0 || r.RSSAfter <= 0 || r.HeapAfter <= 0 || r.N != 20 {
				t.Errorf("raw %s: %+v", b, r)
			}
			// Every connection took at least one handshake (the CPU
			// figure is in clock ticks of 10 ms: too coarse for 20).
			if r.Dials < 20 || r.ServerCPU < 0 || r.Parallel != 20 {
				t.Errorf("raw %s herd: %d dials, server CPU %.3f s, parallel %d", b, r.Dials, r.ServerCPU, r.Parallel)
			}
		})
	}
}

// TestDialGate: a held gate makes dials wait until it is released (or
// their context ends); an open one lets them through.
func TestDialGate(t *testing.T) {
	var g dialGate
	if err := g.wait(context.Background()); err != nil {
		t.Fatalf("open gate: %v", err)
	}
	g.hold()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.wait(ctx); err == nil {
		t.Fatal("held gate let a dial through")
	}
	done := make(chan error, 1)
	go func() { done <- g.wait(context.Background()) }()
	g.release()
	if err := <-done; err != nil {
		t.Fatalf("released gate: %v", err)
	}
}

// TestPKICache: the second call reads the runners back.
func TestPKICache(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	a, err := PreparePKI(dir, 10)
	if err != nil {
		t.Fatal(err)
	}
	b, err := PreparePKI(dir, 10)
	if err != nil {
		t.Fatal(err)
	}
	if !a.Generated || b.Generated || a.CacheFile != b.CacheFile {
		t.Fatalf("generated %v then %v (%s, %s)", a.Generated, b.Generated, a.CacheFile, b.CacheFile)
	}
	for i := range a.Runners {
		if a.Runners[i].ID != b.Runners[i].ID || !bytes.Equal(a.Runners[i].Cert.Certificate[0], b.Runners[i].Cert.Certificate[0]) {
			t.Fatalf("runner %d differs after the cache", i)
		}
	}
	c, err := PreparePKI(dir, 11) // another N: another cache file
	if err != nil || !c.Generated || c.CacheFile == a.CacheFile {
		t.Fatalf("n=11: generated %v, %s, %v", c.Generated, c.CacheFile, err)
	}
}

func TestParseLadder(t *testing.T) {
	steps, err := ParseLadder(StandardLadder)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 5 || steps[1].String() != "quic:3000:kill+graceful" || steps[2].N != 10000 {
		t.Errorf("standard ladder %v", steps)
	}
	s, err := ParseLadder("yamux:20:ramp=5s+kill")
	if err != nil || len(s) != 1 || s[0].Ramp != 5*time.Second || !s[0].Kill || s[0].Backend != "yamux" {
		t.Errorf("%v %v", s, err)
	}
	if s, err := ParseLadder("quic:30:kill+hold=3s"); err != nil || s[0].Hold != 3*time.Second || s[0].String() != "quic:30:kill+hold=3s" {
		t.Errorf("hold: %v %v", s, err)
	}
	for _, bad := range []string{"", "tcp:10", "quic:0", "quic", "quic:10:fast", "quic:10:hold=-1s"} {
		if _, err := ParseLadder(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestLadderMarkdown(t *testing.T) {
	s := &Summary{Backend: "quic", N: 10, Cold: RoundResult{Complete: true, Took: 1500 * time.Millisecond}}
	s.check()
	var b bytes.Buffer
	if err := WriteLadderMarkdown(&b, []LadderResult{{Step: Step{Backend: "quic", N: 10}, Summary: s}, {Step: Step{Backend: "yamux", N: 5}, Err: os.ErrDeadlineExceeded}}, "# t\n"); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, "|") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 4 {
		t.Fatalf("table:\n%s", b.String())
	}
	cols := strings.Count(lines[0], "|")
	for _, l := range lines[1:] {
		if strings.Count(l, "|") != cols {
			t.Errorf("row has %d separators, header %d: %s", strings.Count(l, "|"), cols, l)
		}
	}
	if !strings.Contains(lines[2], "quic:10") || !strings.Contains(lines[2], "| ok |") || !strings.Contains(lines[3], "did not start") {
		t.Errorf("rows:\n%s", b.String())
	}

	// With a raw herd beside the step, a second table carries the ratios.
	s.RawHerd = &RawResult{Took: 500 * time.Millisecond, N: 10, Dials: 10}
	s.Admission = admissionRatios(s)
	s.Handshakes = &HandshakeCounts{Started: 12, Refused: 3, Signed: 11}
	b.Reset()
	if err := WriteLadderMarkdown(&b, []LadderResult{{Step: Step{Backend: "quic", N: 10}, Summary: s}}, "# t\n"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "Admission beside the raw herd") || !strings.Contains(b.String(), "| 3.00× |") || !strings.Contains(b.String(), "12 / 3 / 0 / 11 (9.1%)") {
		t.Errorf("admission table missing or wrong ratio:\n%s", b.String())
	}
}

func TestFailureReason(t *testing.T) {
	if got := FailureReason(context.DeadlineExceeded); got != "timeout" {
		t.Errorf("deadline: %q", got)
	}
	if got := FailureReason(nil); got != "unknown" {
		t.Errorf("nil: %q", got)
	}
}

func TestHistogramQuantile(t *testing.T) {
	h := Histogram{Bounds: []float64{0.001, 0.01, 0.1}, Cum: []uint64{50, 90, 100}, Count: 100}
	if q := h.Quantile(0.5); q != time.Millisecond {
		t.Errorf("p50 %v", q)
	}
	if q := h.Quantile(0.99); q < 10*time.Millisecond || q > 100*time.Millisecond {
		t.Errorf("p99 %v", q)
	}
	d := h.Sub(Histogram{Bounds: h.Bounds, Cum: []uint64{50, 50, 50}, Count: 50})
	if d.Count != 50 || d.Quantile(0.5) <= time.Millisecond {
		t.Errorf("sub %+v p50 %v", d, d.Quantile(0.5))
	}
}
