package soak

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	flagSeed     = flag.Uint64("soak.seed", 0, "fault schedule seed (0: from the time, printed)")
	flagN        = flag.Int("soak.n", 500, "lease lifecycles in all, split over the backends")
	flagBackends = flag.String("soak.backends", "memory,quic,yamux", "comma-separated backends: memory, quic, yamux, webtransport")
	flagFaults   = flag.Bool("soak.faults", true, "inject faults (false: the same lifecycles without faults, the baseline)")
	flagInflight = flag.Int("soak.inflight", 16, "concurrent lifecycles per backend")
	flagSkip     = flag.String("soak.skip", "", "comma-separated fault kinds left out of the schedule (the fault mix), e.g. daemon_crash_restart,clock_step")
	flagDir      = flag.String("soak.dir", "", "directory of the SQLite files, spools and content stores (default /dev/shm if present; \"disk\": the test's temporary directory)")
	flagTimeout  = flag.Duration("soak.timeout", 9*time.Minute, "the run's bound: it fails if the lifecycles take longer")
)

// TestSoak runs the fault-injection soak (package doc). Its default is the
// short run of `make test` (500 lifecycles over memory, QUIC and
// TLS+yamux, every fault kind); `make soak` runs 10,000 over the four
// backends. A failure prints the one command that replays its seed.
func TestSoak(t *testing.T) {
	if !flagGiven("soak.n") && !flagGiven("soak.seed") && os.Getenv("FORGEYARD_SOAK") == "" {
		// `make test` runs the short soak in a step of its own, after
		// `go test -race ./...` (FORGEYARD_SOAK=1, 4 in flight per backend):
		// beside other race-instrumented packages on 2 cores it starved past
		// its per-lifecycle bounds (2 of 2 runs at load 7-9), alone it passed
		// every run (docs/perf.md §13). Inside `go test ./...` it is skipped.
		t.Skip("fault-injection soak: runs in its own step of make test (FORGEYARD_SOAK=1), in make soak, or with -soak.n=N (docs/perf.md §13)")
	}
	cfg := config{seed: *flagSeed, n: *flagN, faults: *flagFaults, inflight: *flagInflight, agents: 4}
	if testing.Short() && !flagGiven("soak.n") {
		cfg.n = 150 // make test-short: every fault kind still scheduled
	}
	if cfg.seed == 0 {
		cfg.seed = uint64(time.Now().UnixNano())
	}
	skip := map[string]bool{}
	for _, k := range strings.Split(*flagSkip, ",") {
		if k = strings.TrimSpace(k); k != "" {
			if !slices.Contains(faultOrder, k) {
				t.Fatalf("soak: -soak.skip: unknown fault kind %q (kinds: %s)", k, strings.Join(faultOrder, ", "))
			}
			skip[k] = true
		}
	}
	for _, b := range strings.Split(*flagBackends, ",") {
		if b = strings.TrimSpace(b); b != "" {
			cfg.backends = append(cfg.backends, b)
		}
	}
	if cfg.n < len(cfg.backends) || len(cfg.backends) == 0 || cfg.inflight < 1 {
		t.Fatalf("soak: -soak.n=%d must be at least the number of backends (%d), -soak.inflight=%d at least 1", cfg.n, len(cfg.backends), cfg.inflight)
	}
	repro := fmt.Sprintf("go test ./internal/testkit/soak -run '^TestSoak$' -count=1 -v -timeout 15m -soak.seed=%d -soak.n=%d -soak.backends=%s -soak.faults=%v -soak.inflight=%d -soak.skip=%s",
		cfg.seed, cfg.n, strings.Join(cfg.backends, ","), cfg.faults, cfg.inflight, *flagSkip)
	// Lifecycle i goes to backend i mod len(backends); its plan depends on
	// the seed and i only.
	nb := len(cfg.backends)
	plans := make([][]plan, nb)
	var all []plan
	for i := 0; i < cfg.n; i++ {
		b := i % nb
		per := (cfg.n - b + nb - 1) / nb
		local := i / nb
		p := makePlan(cfg.seed, i, cfg.faults, cfg.faults && local == per/2, cfg.faults && (local == per/3 || local == 2*per/3), skip)
		plans[b] = append(plans[b], p)
		all = append(all, p)
	}
	t.Logf("soak seed %d: %d lifecycles over %s, faults %v, %d in flight per backend; schedule digest %s",
		cfg.seed, cfg.n, strings.Join(cfg.backends, ","), cfg.faults, cfg.inflight, scheduleDigest(all))

	ctx, cancel := context.WithTimeout(context.Background(), *flagTimeout)
	defer cancel()
	var failMu sync.Mutex
	var failures []string
	fail := func(err error) {
		failMu.Lock()
		failures = append(failures, err.Error())
		failMu.Unlock()
		cancel()
	}
	clusters := make([]*cluster, nb)
	for b, name := range cfg.backends {
		clusters[b] = newCluster(t, cfg, name, fail)
	}
	results := make([]result, nb)
	var wg sync.WaitGroup
	start := time.Now()
	for b := range clusters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := clusters[b].run(ctx, plans[b])
			results[b] = res
			if err != nil {
				fail(fmt.Errorf("%w\n%s daemon and agent warnings (tail):\n%s", err, clusters[b].nb.name, clusters[b].logTail(20)))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	failMu.Lock()
	defer failMu.Unlock()
	if len(failures) > 0 {
		for _, f := range failures {
			t.Error(f)
		}
		t.Errorf("soak FAILED; reproduce the fault schedule (seed %d) with:\n  %s", cfg.seed, repro)
		fmt.Fprintf(os.Stderr, "\nSOAK FAILED — reproduce with:\n  %s\n\n", repro)
		return
	}
	total := map[string]int64{}
	obs := map[string]int64{}
	for _, r := range results {
		t.Logf("%-12s %5d lifecycles in %6.1fs = %6.1f/s; faults: %s; observed: %s", r.backend, r.lifecycles, r.elapsed.Seconds(),
			float64(r.lifecycles)/r.elapsed.Seconds(), formatCounts(r.faults), formatCounts(r.observed))
		for k, v := range r.faults {
			total[k] += v
		}
		for k, v := range r.observed {
			obs[k] += v
		}
	}
	var sum int64
	for _, k := range faultOrder {
		sum += total[k]
	}
	t.Logf("SOAK seed=%d faults=%v: %d lifecycles in %.1fs = %.1f lifecycles/s; %d faults injected: %s; observed: %s",
		cfg.seed, cfg.faults, cfg.n, elapsed.Seconds(), float64(cfg.n)/elapsed.Seconds(), sum, formatCounts(total), formatCounts(obs))
	if cfg.faults {
		// Every kind the schedule holds must have been injected.
		for _, k := range faultOrder {
			if total[k] == 0 && scheduled(all, k) {
				t.Errorf("fault kind %s scheduled but never injected", k)
			}
		}
	}
}

// flagGiven reports whether the flag was set on the command line.
func flagGiven(name string) bool {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// scheduled reports whether the plans hold fault kind k.
func scheduled(plans []plan, k string) bool {
	for _, p := range plans {
		switch {
		case k == fCut && p.Cut, k == fCancel && p.Cancel, k == fDupCancel && p.CancelCopies > 1, k == fEarlyCancel && p.CancelEarly,
			k == fDupOffer && p.DupOffer, k == fAuthErrBefore && p.AuthFails > 0 && !p.AuthAfter, k == fAuthErrAfter && p.AuthAfter,
			k == fAuthLatency && p.AuthDelay > 0, k == fCrash && p.Crash, k == fClockStep && p.ClockStep != 0:
			return true
		}
	}
	return false
}

// TestScheduleIsAFunctionOfTheSeed: the same seed gives the same fault
// schedule (what a replay re-creates), another seed another one, and a
// no-fault schedule holds no fault.
func TestScheduleIsAFunctionOfTheSeed(t *testing.T) {
	mk := func(seed uint64, faults bool) []plan {
		var ps []plan
		for i := 0; i < 2000; i++ {
			ps = append(ps, makePlan(seed, i, faults, i == 1000, i == 500, nil))
		}
		return ps
	}
	a, b, c := mk(7, true), mk(7, true), mk(8, true)
	if scheduleDigest(a) != scheduleDigest(b) {
		t.Fatal("one seed gave two schedules")
	}
	if scheduleDigest(a) == scheduleDigest(c) {
		t.Fatal("two seeds gave one schedule")
	}
	for _, k := range faultOrder {
		if !scheduled(a, k) {
			t.Errorf("2,000 lifecycles schedule no %s", k)
		}
	}
	for _, k := range faultOrder {
		if scheduled(mk(7, false), k) {
			t.Errorf("the no-fault schedule holds %s", k)
		}
	}
}
