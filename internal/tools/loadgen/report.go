package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"forgeyard.dev/transport/semantics/telemetry/tablecell"
)

// Summary is one run's result; its JSON form is `forgeyard-loadgen --json`.
// Durations are nanoseconds in JSON.
type Summary struct {
	Backend           string        `json:"backend"`
	N                 int           `json:"n"`
	Ramp              time.Duration `json:"ramp_ns"`
	SteadyFor         time.Duration `json:"steady_ns"`
	HeartbeatInterval time.Duration `json:"heartbeat_interval_ns"` // as configured on the daemon (0: its default)
	LeaseRate         float64       `json:"lease_rate_per_s"`
	Started           time.Time     `json:"started"`
	Took              time.Duration `json:"took_ns"`
	CertsGenerated    bool          `json:"certs_generated"`
	CertsTook         time.Duration `json:"certs_took_ns"`

	Cold     RoundResult     `json:"cold_start"`
	Steady   SteadyResult    `json:"steady"`
	Restarts []RestartResult `json:"restarts,omitempty"`
	Daemon   DaemonResult    `json:"daemon"`
	Raw      *RawResult      `json:"raw,omitempty"`
	// RawHerd is the raw baseline's herd: the same N clients (same
	// certificates, curves and one-process fleet) all at once against a
	// raw server; Admission compares the cold start with it.
	RawHerd   *RawResult       `json:"raw_herd,omitempty"`
	Admission *AdmissionRatios `json:"admission_vs_raw,omitempty"`
	// Handshakes are the daemon listener's admission counters after the
	// cold start (QUIC and WebTransport).
	Handshakes *HandshakeCounts `json:"handshakes,omitempty"`
	RSSRatio   float64          `json:"rss_ratio_to_raw,omitempty"`
	// HeapRatio needs the daemon's go_memstats on /metrics.
	HeapRatio float64 `json:"heap_ratio_to_raw,omitempty"`

	AttemptsTotal     int64            `json:"connection_attempts"`
	FailedTotal       int64            `json:"failed_attempts"`
	Failed            map[string]int64 `json:"failed_by_reason"`
	AgentWarnings     map[string]int64 `json:"agent_warnings,omitempty"` // the agents' warning log lines, by message
	Reconnects        int64            `json:"reconnects"`
	HeartbeatTimeouts int64            `json:"heartbeat_timeouts"`
	Drops             int64            `json:"drops"` // registered agents disconnected while no restart was under way
	Leases            LeaseStats       `json:"leases"`
	Completions       CompletionStats  `json:"completions"`
	LogFinalizeFailed int64            `json:"log_finalize_failed"` // attempts completed without a passed logs-finalized barrier
	OutputsUploaded   int64            `json:"outputs_uploaded"`
	OutputsFailed     int64            `json:"outputs_failed"`
	// LostAttempts names up to 10 lost attempts with what the fleet saw of
	// them (runs, acks), to look up in the daemon's log.
	LostAttempts []string `json:"lost_attempts,omitempty"`
	// Profiles lists the daemon profiles written (Options.Profile).
	Profiles []string `json:"profiles,omitempty"`

	TimedOut   bool     `json:"timed_out"`
	Violations []string `json:"violations,omitempty"`
}

// AdmissionRatios compare the cold start (and the kill-restart) with the
// raw herd: how much longer, how many more handshakes, how much more CPU.
type AdmissionRatios struct {
	TookRatio           float64 `json:"took_ratio"`              // cold start / raw herd
	HandshakesPerAgent  float64 `json:"handshakes_per_agent"`    // ours (dials / N)
	RawDialsPerConn     float64 `json:"raw_dials_per_conn"`      // raw herd
	DaemonCPUPerAgent   float64 `json:"daemon_cpu_per_agent_ms"` // cold start's daemon CPU / N
	RawServerCPUPerConn float64 `json:"raw_server_cpu_per_conn_ms"`
	CPURatio            float64 `json:"cpu_ratio"`
	RestartTookRatio    float64 `json:"kill_restart_took_ratio,omitempty"` // kill-restart's all-back / raw herd
}

// HandshakeCounts are forgeyard_transport_handshakes_total after the cold
// start. Signed beyond the N registrations is handshake CPU thrown away.
type HandshakeCounts struct {
	Started, Completed, Refused, TimedOut, Failed, Signed int64
}

// WastedShare is the share of paid handshakes (signed) that did not
// become one of the n registrations.
func (h *HandshakeCounts) WastedShare(n int) float64 {
	if h == nil || h.Signed == 0 {
		return 0
	}
	return max(0, float64(h.Signed-int64(n))/float64(h.Signed))
}

func admissionRatios(s *Summary) *AdmissionRatios {
	r := s.RawHerd
	if r == nil || r.N == 0 || r.Took <= 0 {
		return nil
	}
	a := &AdmissionRatios{
		TookRatio:           s.Cold.Took.Seconds() / r.Took.Seconds(),
		HandshakesPerAgent:  s.Cold.AttemptsPerAgent.Mean,
		RawDialsPerConn:     float64(r.Dials) / float64(r.N),
		DaemonCPUPerAgent:   s.Cold.DaemonCPU * 1000 / float64(s.N),
		RawServerCPUPerConn: r.ServerCPU * 1000 / float64(r.N),
	}
	if a.RawServerCPUPerConn > 0 {
		a.CPURatio = a.DaemonCPUPerAgent / a.RawServerCPUPerConn
	}
	for _, rr := range s.Restarts {
		if rr.Kind == "kill-restart" && rr.Round.Complete {
			a.RestartTookRatio = rr.Round.Took.Seconds() / r.Took.Seconds()
		}
	}
	return a
}

// RoundResult is one wait for every agent to register.
type RoundResult struct {
	Complete             bool             `json:"complete"`
	Pending              int64            `json:"pending"`
	Took                 time.Duration    `json:"took_ns"`
	PeakPerSecond        int64            `json:"peak_registrations_per_s"`
	AttemptsPerAgent     AttemptStats     `json:"attempts_per_agent"`
	Failed               int64            `json:"failed_attempts"`                   // during the round
	FailedByReason       map[string]int64 `json:"failed_by_reason,omitempty"`        // cold start only
	AttemptsPerAgentMean float64          `json:"attempts_per_agent_mean,omitempty"` // restarts: attempts during the round / N
	HeartbeatP99         time.Duration    `json:"heartbeat_p99_ns,omitempty"`        // of registered agents during the cold start
	HealthzP50           time.Duration    `json:"healthz_p50_ns,omitempty"`
	HealthzP99           time.Duration    `json:"healthz_p99_ns,omitempty"`
	// DaemonCPU and LoadgenCPU are the CPU seconds (user+system) the
	// daemon and the loadgen process (the fleet) used during the round:
	// on a shared machine they say which side the cores went to.
	DaemonCPU  float64 `json:"daemon_cpu_s,omitempty"`
	LoadgenCPU float64 `json:"loadgen_cpu_s,omitempty"`
}

// AttemptStats are connection attempts per agent.
type AttemptStats struct {
	Mean float64 `json:"mean"`
	P50  int64   `json:"p50"`
	Max  int64   `json:"max"`
}

// SteadyResult is the measuring window after the cold start.
type SteadyResult struct {
	Heartbeats int64 `json:"heartbeats"`
	// ObservedInterval is window × N / heartbeats acked: the interval the
	// daemon set, as measured.
	ObservedInterval time.Duration `json:"heartbeat_interval_observed_ns"`
	HeartbeatP50     time.Duration `json:"heartbeat_p50_ns"`
	HeartbeatP99     time.Duration `json:"heartbeat_p99_ns"`
	HealthzP50       time.Duration `json:"healthz_p50_ns"`
	HealthzP99       time.Duration `json:"healthz_p99_ns"`
}

// RestartResult is a daemon restart and the fleet's return.
type RestartResult struct {
	Kind      string        `json:"kind"` // kill-restart, graceful-restart
	Round     RoundResult   `json:"round"`
	Noticed   int           `json:"noticed"`       // agents whose link ended
	NoticeP50 time.Duration `json:"notice_p50_ns"` // stop → the agent's link ended
	NoticeMax time.Duration `json:"notice_max_ns"`
	// Ready is stop → the restarted daemon answered (its listeners
	// accept); an agent can learn of a restart only after it. The
	// *AfterReady figures are the notices measured from then (0 for an
	// agent that noticed earlier, as TCP agents do at the kill).
	Ready               time.Duration `json:"ready_ns"`
	NoticeP50AfterReady time.Duration `json:"notice_p50_after_ready_ns"`
	NoticeMaxAfterReady time.Duration `json:"notice_max_after_ready_ns"`
	// How the links ended, from the agents' counters over the round: by a
	// restart hint carrying the link's token (agent.ErrDaemonRestarted),
	// and the hints answered with a heartbeat probe and the links those
	// ended by their window (agent.ErrRestartHinted).
	TokenEnds    int64 `json:"restart_token_ends"`
	HintProbes   int64 `json:"restart_hint_probes"`
	HintTimeouts int64 `json:"restart_hint_timeouts"`
}

// DaemonResult are the daemon process's figures (/proc/<pid>, /metrics).
type DaemonResult struct {
	RSSIdle      int64   `json:"rss_idle_bytes"`
	RSS          int64   `json:"rss_bytes"`
	HWM          int64   `json:"rss_peak_bytes"`
	RSSPerAgent  float64 `json:"rss_per_agent_bytes"`
	HeapIdle     int64   `json:"heap_idle_bytes,omitempty"`
	Heap         int64   `json:"heap_bytes,omitempty"`
	HeapPerAgent float64 `json:"heap_per_agent_bytes,omitempty"`
	// Goroutines before the fleet and after the steady window (go_goroutines
	// on /metrics; 0 when the daemon does not export the Go collector).
	GoroutinesIdle     int64   `json:"goroutines_idle,omitempty"`
	Goroutines         int64   `json:"goroutines,omitempty"`
	GoroutinesPerAgent float64 `json:"goroutines_per_agent,omitempty"`
	// Goroutine stacks (go_memstats_stack_inuse_bytes) and the free heap
	// the runtime has not returned to the OS, after the steady window.
	StackIdle         int64   `json:"stack_idle_bytes,omitempty"`
	Stack             int64   `json:"stack_bytes,omitempty"`
	StackPerAgent     float64 `json:"stack_per_agent_bytes,omitempty"`
	HeapUnreturned    int64   `json:"heap_unreturned_bytes,omitempty"`
	CPUSeconds        float64 `json:"cpu_seconds"`
	CPUSecondsSteady  float64 `json:"cpu_seconds_steady"`
	CPUPercentPer1000 float64 `json:"cpu_percent_per_1000_agents"` // of one core, steady window
	FDs               int     `json:"fds"`
	Threads           int     `json:"threads"`
}

// CompletionStats check exactly-once: every lease an agent accepted must
// be recorded once (Lost counts those that were not), and no attempt may
// run or be recorded twice (Duplicated). Revoked counts the accepted
// leases without a recorded completion whose attempt the daemon cancelled
// with LeaseRevoked or whose completion it answered StaleRejected (its
// agent lost its link — a dropped agent — and the lease expired): by the
// protocol those end without a recorded completion, so they are
// reported beside Lost, not in it (the dropped agents are reported as
// such).
type CompletionStats struct {
	Accepted   int `json:"accepted"`
	Duplicated int `json:"duplicated"`
	Lost       int `json:"lost"`
	Revoked    int `json:"revoked"`
	DupAcks    int `json:"duplicate_acks"` // re-sent completions the daemon absorbed (not a violation)
	Stale      int `json:"stale"`
}

// OK reports whether the run kept every promise it checks.
func (s *Summary) OK() bool { return len(s.Violations) == 0 }

func (s *Summary) check() {
	if s.Completions.Lost > 0 {
		s.Violations = append(s.Violations, fmt.Sprintf("%d accepted leases never completed (lost)", s.Completions.Lost))
	}
	if s.Completions.Duplicated > 0 {
		s.Violations = append(s.Violations, fmt.Sprintf("%d attempts ran or were recorded twice (duplicated)", s.Completions.Duplicated))
	}
	if !s.Cold.Complete {
		s.Violations = append(s.Violations, fmt.Sprintf("cold start: %d of %d agents never registered", s.Cold.Pending, s.N))
	}
	for _, r := range s.Restarts {
		if !r.Round.Complete {
			s.Violations = append(s.Violations, fmt.Sprintf("%s: %d of %d agents not registered again", r.Kind, r.Round.Pending, s.N))
		}
	}
	if s.TimedOut {
		s.Violations = append(s.Violations, "the run hit its timeout")
	}
}

// WriteJSON writes the summary as indented JSON.
func (s *Summary) WriteJSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(s)
}

func ms(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	if d < 10*time.Millisecond {
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	}
	if d < 10*time.Second {
		return fmt.Sprintf("%.0f ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

func kib(b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f KiB", b/1024)
}

func mib(b int64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

// WriteTable writes the summary as a two-column text table.
func (s *Summary) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	ramp := "all at once"
	if s.Ramp > 0 {
		ramp = "over " + s.Ramp.String()
	}
	hb := "daemon default"
	if s.HeartbeatInterval > 0 {
		hb = s.HeartbeatInterval.String()
	}
	row("scenario", fmt.Sprintf("%d %s agents, started %s, heartbeat %s, %.1f leases/s", s.N, s.Backend, ramp, hb, s.LeaseRate))
	row("certificates", fmt.Sprintf("%s in %s", map[bool]string{true: "generated", false: "from cache"}[s.CertsGenerated], s.CertsTook.Round(time.Millisecond)))
	row("all registered (cold)", roundCell(s.Cold))
	row("attempts per agent", fmt.Sprintf("mean %.2f, p50 %d, max %d", s.Cold.AttemptsPerAgent.Mean, s.Cold.AttemptsPerAgent.P50, s.Cold.AttemptsPerAgent.Max))
	if s.Cold.DaemonCPU > 0 || s.Cold.LoadgenCPU > 0 {
		row("CPU during the cold start", fmt.Sprintf("daemon %.1f s, loadgen (the fleet) %.1f s, of %.1f s wall × %d cores",
			s.Cold.DaemonCPU, s.Cold.LoadgenCPU, s.Cold.Took.Seconds(), runtime.NumCPU()))
	}
	row("peak registrations/s", fmt.Sprint(s.Cold.PeakPerSecond))
	row("failed attempts (cold start)", fmt.Sprintf("%d%s", s.Cold.Failed, reasons(s.Cold.FailedByReason)))
	row("failed attempts (whole run)", fmt.Sprintf("%d of %d%s", s.FailedTotal, s.AttemptsTotal, reasons(s.Failed)))
	row("heartbeat p99 during herd", ms(s.Cold.HeartbeatP99))
	row("heartbeat p50 / p99 steady", ms(s.Steady.HeartbeatP50)+" / "+ms(s.Steady.HeartbeatP99)+fmt.Sprintf(" (%d acked: one per agent every %s)", s.Steady.Heartbeats, ms(s.Steady.ObservedInterval)))
	row("/healthz p50 / p99 herd", ms(s.Cold.HealthzP50)+" / "+ms(s.Cold.HealthzP99))
	row("/healthz p50 / p99 steady", ms(s.Steady.HealthzP50)+" / "+ms(s.Steady.HealthzP99))
	row("registered agents dropped", fmt.Sprintf("%d (heartbeat timeouts %d, reconnects %d)", s.Drops, s.HeartbeatTimeouts, s.Reconnects))
	row("daemon RSS", fmt.Sprintf("%s (idle %s, peak %s), %s per agent", mib(s.Daemon.RSS), mib(s.Daemon.RSSIdle), mib(s.Daemon.HWM), kib(s.Daemon.RSSPerAgent)))
	row("daemon Go heap", fmt.Sprintf("%s, %s per agent", mib(s.Daemon.Heap), kib(s.Daemon.HeapPerAgent)))
	row("daemon goroutines", fmt.Sprintf("%d (idle %d), %.2f per agent; stacks %s, %s per agent; free heap not returned to the OS %s",
		s.Daemon.Goroutines, s.Daemon.GoroutinesIdle, s.Daemon.GoroutinesPerAgent, mib(s.Daemon.Stack), kib(s.Daemon.StackPerAgent), mib(s.Daemon.HeapUnreturned)))
	if s.Raw != nil {
		row("raw "+s.Raw.Backend+" per connection", fmt.Sprintf("RSS %s, heap %s, %.2f goroutines, stacks %s (N=%d)", kib(s.Raw.RSSPerConn), kib(s.Raw.HeapPerConn), s.Raw.GoroutinesPerConn, kib(s.Raw.StackPerConn), s.Raw.N))
		ratio := func(r float64) string {
			if r == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f×", r)
		}
		row("daemon / raw per connection", "RSS "+ratio(s.RSSRatio)+", heap "+ratio(s.HeapRatio))
	}
	if r, a := s.RawHerd, s.Admission; r != nil && a != nil {
		row("raw "+r.Backend+" herd (all at once)", fmt.Sprintf("%s, %.2f dials per connection, server CPU %.2f ms per connection (client %.2f ms)",
			ms(r.Took), a.RawDialsPerConn, a.RawServerCPUPerConn, r.ClientCPU*1000/float64(r.N)))
		row("cold start / raw herd", fmt.Sprintf("time %.2f×, handshakes per agent %.2f vs %.2f, daemon CPU per agent %.2f ms (%.2f×)",
			a.TookRatio, a.HandshakesPerAgent, a.RawDialsPerConn, a.DaemonCPUPerAgent, a.CPURatio))
	}
	row("daemon CPU", fmt.Sprintf("%.1f s total; steady %.1f%% of a core per 1,000 agents", s.Daemon.CPUSeconds, s.Daemon.CPUPercentPer1000))
	if s.Steady.Heartbeats > 0 && s.Daemon.CPUSecondsSteady > 0 {
		row("daemon CPU per heartbeat (steady)", fmt.Sprintf("%d µs (%.1f s over %d heartbeats)", int64(s.Daemon.CPUSecondsSteady/float64(s.Steady.Heartbeats)*1e6), s.Daemon.CPUSecondsSteady, s.Steady.Heartbeats))
	}
	if s.Raw != nil && s.Raw.Echoes > 0 {
		row("raw steady echo ("+s.Raw.Backend+")", fmt.Sprintf("%.1f%% of a core per 1,000 connections; %d µs per %d-byte echo (%.1f s over %d echoes, every %s)",
			s.Raw.EchoCPUPercent1000, s.Raw.EchoCPUPerEcho.Microseconds(), rawEchoSize, s.Raw.EchoCPUSeconds, s.Raw.Echoes, ms(s.Raw.EchoInterval)))
	}
	row("daemon fds / threads", fmt.Sprintf("%d / %d", s.Daemon.FDs, s.Daemon.Threads))
	row("leases", fmt.Sprintf("%d offered, %d accepted, %d rejected, %d failed, %d skipped", s.Leases.Offered, s.Leases.Accepted, s.Leases.Rejected, s.Leases.Failed, s.Leases.Skipped))
	row("offer→accept p50 / p99 / max", ms(s.Leases.AcceptP50)+" / "+ms(s.Leases.AcceptP99)+" / "+ms(s.Leases.AcceptMax))
	c := s.Completions
	row("completions", fmt.Sprintf("%d recorded, %d duplicated, %d lost, %d revoked by the daemon (%d duplicate acks absorbed, %d stale)", c.Accepted, c.Duplicated, c.Lost, c.Revoked, c.DupAcks, c.Stale))
	row("logs and outputs", fmt.Sprintf("%d outputs uploaded, %d failed; %d attempts without a logs-finalized barrier", s.OutputsUploaded, s.OutputsFailed, s.LogFinalizeFailed))
	if len(s.AgentWarnings) > 0 {
		row("agent warnings", strings.TrimPrefix(reasons(s.AgentWarnings), " "))
	}
	for _, p := range s.Profiles {
		row("daemon profile", p+" (go tool pprof -top)")
	}
	for _, a := range s.LostAttempts {
		row("lost attempt", a)
	}
	for _, r := range s.Restarts {
		row(r.Kind, roundCell(r.Round)+fmt.Sprintf("; %d noticed, p50 %s, max %s (after the restarted daemon was ready in %s: p50 %s, max %s); %.2f attempts per agent, %d failed; peak %d/s; links ended by a restart token %d, hints probed %d, hint windows expired %d", r.Noticed, ms(r.NoticeP50), ms(r.NoticeMax), ms(r.Ready), ms(r.NoticeP50AfterReady), ms(r.NoticeMaxAfterReady), r.Round.AttemptsPerAgentMean, r.Round.Failed, r.Round.PeakPerSecond, r.TokenEnds, r.HintProbes, r.HintTimeouts))
	}
	verdict := "ok"
	if !s.OK() {
		verdict = "FAILED: " + strings.Join(s.Violations, "; ")
	}
	row("result", verdict)
	return tw.Flush()
}

func roundCell(r RoundResult) string {
	if r.Complete {
		return ms(r.Took)
	}
	return fmt.Sprintf("not all: %d pending after %s", r.Pending, ms(r.Took))
}

func reasons(m map[string]int64) string {
	c := make(map[string]int, len(m))
	for k, v := range m {
		c[k] = int(v)
	}
	return tablecell.ByBackend(c)
}
