package loadgen

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// StandardLadder is `make scale`'s default: QUIC at 1,000, 3,000 and
// 10,000 agents, yamux and WebTransport at 3,000, each a cold start with
// every agent at once; the 3,000 QUIC step also SIGKILLs and gracefully
// restarts the daemon.
const StandardLadder = "quic:1000,quic:3000:kill+graceful,quic:10000,yamux:3000,webtransport:3000"

// Step is one rung of the ladder: backend:N[:options], options joined by
// "+": kill (SIGKILL restart), graceful (SIGTERM restart), ramp=DURATION,
// hold=DURATION (Options.RedialHold).
type Step struct {
	Backend  string
	N        int
	Kill     bool
	Graceful bool
	Ramp     time.Duration
	Hold     time.Duration // Options.RedialHold
}

func (s Step) String() string {
	out := fmt.Sprintf("%s:%d", s.Backend, s.N)
	var opts []string
	if s.Kill {
		opts = append(opts, "kill")
	}
	if s.Graceful {
		opts = append(opts, "graceful")
	}
	if s.Hold > 0 {
		opts = append(opts, "hold="+s.Hold.String())
	}
	if s.Ramp > 0 {
		opts = append(opts, "ramp="+s.Ramp.String())
	}
	if len(opts) > 0 {
		out += ":" + strings.Join(opts, "+")
	}
	return out
}

// ParseLadder parses a comma-separated list of steps.
func ParseLadder(spec string) ([]Step, error) {
	var out []Step
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		parts := strings.SplitN(item, ":", 3)
		if len(parts) < 2 {
			return nil, fmt.Errorf("ladder step %q: want backend:N[:options]", item)
		}
		st := Step{Backend: parts[0]}
		switch st.Backend {
		case "quic", "yamux", "webtransport":
		default:
			return nil, fmt.Errorf("ladder step %q: unknown backend %q", item, st.Backend)
		}
		n, err := strconv.Atoi(parts[1])
		if err != nil || n < 1 || n > MaxRunners {
			return nil, fmt.Errorf("ladder step %q: N must be 1–%d", item, MaxRunners)
		}
		st.N = n
		if len(parts) == 3 {
			for _, o := range strings.Split(parts[2], "+") {
				switch {
				case o == "kill":
					st.Kill = true
				case o == "graceful":
					st.Graceful = true
				case strings.HasPrefix(o, "ramp="):
					if st.Ramp, err = time.ParseDuration(strings.TrimPrefix(o, "ramp=")); err != nil || st.Ramp < 0 {
						return nil, fmt.Errorf("ladder step %q: bad ramp", item)
					}
				case strings.HasPrefix(o, "hold="):
					if st.Hold, err = time.ParseDuration(strings.TrimPrefix(o, "hold=")); err != nil || st.Hold < 0 {
						return nil, fmt.Errorf("ladder step %q: bad hold", item)
					}
				default:
					return nil, fmt.Errorf("ladder step %q: unknown option %q (kill, graceful, ramp=D, hold=D)", item, o)
				}
			}
		}
		out = append(out, st)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty ladder")
	}
	return out, nil
}

// LadderResult is one step's outcome.
type LadderResult struct {
	Step    Step
	Summary *Summary // nil when the step could not start
	Err     error
}

// RunLadder runs the steps one after the other, each with base's settings
// and its own Timeout, in a directory of its own under base.Dir; a failed
// or timed-out step is recorded and the ladder goes on.
func RunLadder(ctx context.Context, steps []Step, base Options, log io.Writer) []LadderResult {
	var out []LadderResult
	for i, st := range steps {
		o := base
		o.Backend, o.N, o.Ramp, o.KillRestart, o.GracefulRestart, o.RedialHold = st.Backend, st.N, st.Ramp, st.Kill, st.Graceful, st.Hold
		o.Dir = fmt.Sprintf("%s/step%d-%s-%d", base.Dir, i+1, st.Backend, st.N)
		if log != nil {
			fmt.Fprintf(log, "== step %d/%d: %s (timeout %v)\n", i+1, len(steps), st, o.Timeout)
		}
		s, err := Run(ctx, o)
		out = append(out, LadderResult{Step: st, Summary: s, Err: err})
		if log != nil && s != nil {
			_ = s.WriteTable(log)
		}
		if log != nil && err != nil {
			fmt.Fprintf(log, "step %s: %v\n", st, err)
		}
		if ctx.Err() != nil {
			break
		}
	}
	return out
}

// WriteLadderMarkdown writes the scale table (docs/perf.md's format).
func WriteLadderMarkdown(w io.Writer, results []LadderResult, header string) error {
	var b strings.Builder
	b.WriteString(header)
	b.WriteString("\n| step | all registered | attempts/agent (mean, max) | failed attempts (cold) | peak reg/s | heartbeat p50 / p99 steady (interval per agent) | heartbeat p99 herd | /healthz p99 herd / steady | daemon RSS per agent | raw per conn (raw herd's) | ratio (to the raw herd's) | daemon heap per agent (raw) | goroutines per agent (raw); their stacks | steady CPU per 1,000 agents (raw echo) | offer→accept p99 | completions recorded / dup / lost / revoked | kill-restart: noticed max (after the restarted daemon was ready), all back | graceful: all back | result |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		s := r.Summary
		if s == nil {
			fmt.Fprintf(&b, "| %s | %s |%s\n", r.Step, "did not start: "+strings.ReplaceAll(fmt.Sprint(r.Err), "|", "/"), strings.Repeat(" |", 17))
			continue
		}
		raw, ratio := "-", "-"
		heap, gs := kib(s.Daemon.HeapPerAgent), fmt.Sprintf("%.2f", s.Daemon.GoroutinesPerAgent)
		stack := kib(s.Daemon.StackPerAgent)
		cpu := fmt.Sprintf("%.1f%%", s.Daemon.CPUPercentPer1000)
		if s.Raw != nil {
			raw = kib(s.Raw.RSSPerConn)
			heap += " (" + kib(s.Raw.HeapPerConn) + ")"
			gs += fmt.Sprintf(" (%.2f)", s.Raw.GoroutinesPerConn)
			stack += " (" + kib(s.Raw.StackPerConn) + ")"
			if s.Raw.Echoes > 0 {
				cpu += fmt.Sprintf(" (%.1f%%)", s.Raw.EchoCPUPercent1000)
			}
			if s.RSSRatio > 0 {
				ratio = fmt.Sprintf("%.2f×", s.RSSRatio)
			}
			// The fleet came as a herd: the raw herd's process, which
			// admitted the same N at once, is the like-for-like RSS.
			if h := s.RawHerd; h != nil && h.RSSPerConn > 0 {
				raw += " (" + kib(h.RSSPerConn) + ")"
				ratio += fmt.Sprintf(" (%.2f×)", s.Daemon.RSSPerAgent/h.RSSPerConn)
			}
		}
		kill, grace := "-", "-"
		for _, rr := range s.Restarts {
			cell := roundCell(rr.Round)
			if rr.Kind == "kill-restart" {
				kill = ms(rr.NoticeMax) + " (" + ms(rr.NoticeMaxAfterReady) + " after ready), " + cell
			} else {
				grace = cell
			}
		}
		verdict := "ok"
		if !s.OK() {
			verdict = "FAILED: " + strings.Join(s.Violations, "; ")
		}
		if r.Err != nil {
			verdict = "FAILED: " + r.Err.Error()
		}
		fmt.Fprintf(&b, "| %s | %s | %.2f, %d | %d%s | %d | %s / %s (%s) | %s | %s / %s | %s | %s | %s | %s | %s | %s | %s | %d / %d / %d / %d | %s | %s | %s |\n",
			r.Step, roundCell(s.Cold), s.Cold.AttemptsPerAgent.Mean, s.Cold.AttemptsPerAgent.Max, s.Cold.Failed, reasons(s.Cold.FailedByReason), s.Cold.PeakPerSecond,
			ms(s.Steady.HeartbeatP50), ms(s.Steady.HeartbeatP99), ms(s.Steady.ObservedInterval), ms(s.Cold.HeartbeatP99), ms(s.Cold.HealthzP99), ms(s.Steady.HealthzP99),
			kib(s.Daemon.RSSPerAgent), raw, ratio, heap, gs+"; "+stack, cpu, ms(s.Leases.AcceptP99),
			s.Completions.Accepted, s.Completions.Duplicated, s.Completions.Lost, s.Completions.Revoked, kill, grace, strings.ReplaceAll(verdict, "|", "/"))
	}
	writeAdmissionMarkdown(&b, results)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeAdmissionMarkdown is the second table: each step's admission beside
// the raw herd of the same run (Summary.Admission).
func writeAdmissionMarkdown(b *strings.Builder, results []LadderResult) {
	any := false
	for _, r := range results {
		any = any || (r.Summary != nil && r.Summary.Admission != nil)
	}
	if !any { // no step ran the raw herd (--raw off): no empty table
		return
	}
	b.WriteString("\nAdmission beside the raw herd (same N clients, certificates and curves, all at once, against a raw server process):\n\n")
	b.WriteString("| step | all registered | raw herd | ratio | handshakes per agent (raw) | daemon CPU per agent | raw server CPU per conn | ratio | handshakes started / refused / timed out / signed (wasted) | kill-restart all back (ratio to raw herd) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		s := r.Summary
		if s == nil || s.Admission == nil {
			continue
		}
		a := s.Admission
		kill := "-"
		for _, rr := range s.Restarts {
			if rr.Kind == "kill-restart" {
				kill = roundCell(rr.Round)
				if a.RestartTookRatio > 0 {
					kill += fmt.Sprintf(" (%.2f×)", a.RestartTookRatio)
				}
			}
		}
		hs := "-"
		if h := s.Handshakes; h != nil {
			hs = fmt.Sprintf("%d / %d / %d / %d (%.1f%%)", h.Started, h.Refused, h.TimedOut, h.Signed, 100*h.WastedShare(s.N))
		}
		fmt.Fprintf(b, "| %s | %s | %s | %.2f× | %.2f (%.2f) | %.2f ms | %.2f ms | %.2f× | %s | %s |\n",
			r.Step, roundCell(s.Cold), ms(s.RawHerd.Took), a.TookRatio, a.HandshakesPerAgent, a.RawDialsPerConn,
			a.DaemonCPUPerAgent, a.RawServerCPUPerConn, a.CPURatio, hs, kill)
	}
}
