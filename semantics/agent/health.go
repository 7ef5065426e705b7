package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/admin"
	"forgeyard.dev/transport/wire/health"
)

// Health (§96): the agent reports a health summary on every new link and
// answers the daemon's probe requests (admin RunHealthProbeV1 and
// health.ProbeRequestV1) with the result of a built-in probe — a fixed
// kind, never a program (§98): connectivity (its link to the daemon),
// disk (its spool directory is writable), clock (its offset from the
// daemon's clock), or all three; Config.HealthChecks adds the host's own.

// Clock offsets beyond these make the clock check Degraded and Unhealthy.
// The agent judges daemon deadlines on the daemon's clock (clock.go), so
// a skew does not break leases; it is still worth an operator's look.
const (
	clockDegraded  = 2 * time.Second
	clockUnhealthy = 5 * time.Minute
)

// probe runs probe kind k and returns its summary.
func (a *Agent) probe(ctx context.Context, l *link, k health.ProbeKind) health.HealthSummaryV1 {
	var checks []health.HealthCheckV1
	if k == health.ProbeConnectivity || k == health.ProbeFull {
		c := health.HealthCheckV1{Name: "connectivity", Status: health.Unhealthy, Message: "no link to the daemon"}
		if l != nil {
			c.Status, c.Message = health.Healthy, truncate(fmt.Sprintf("connected to %s over %s (protocol %s)", l.ep.Address, l.ep.Backend, l.protocol))
		}
		checks = append(checks, c)
	}
	if k == health.ProbeDisk || k == health.ProbeFull {
		checks = append(checks, a.diskCheck())
	}
	if k == health.ProbeClock || k == health.ProbeFull {
		c := health.HealthCheckV1{Name: "clock", Status: health.Degraded, Message: "no server time received yet"}
		if off, ok := a.ClockOffset(); ok {
			abs := off.Abs()
			c.Status = health.Healthy
			switch {
			case abs > clockUnhealthy:
				c.Status = health.Unhealthy
			case abs > clockDegraded:
				c.Status = health.Degraded
			}
			c.Message = "offset from the daemon's clock " + off.Round(time.Millisecond).String()
		}
		checks = append(checks, c)
	}
	if f := a.cfg.HealthChecks; f != nil {
		seen := map[string]bool{}
		for _, c := range checks {
			seen[c.Name] = true
		}
		for _, c := range f(ctx, k) {
			c.Message = truncate(c.Message)
			if len(checks) < health.MaxChecks && !seen[c.Name] && c.Name != "" && len(c.Name) <= health.MaxCheckName && c.Status <= health.Unhealthy {
				seen[c.Name] = true
				checks = append(checks, c)
			}
		}
	}
	s := health.HealthSummaryV1{Status: health.Healthy, Checks: checks, UptimeMs: uint64(time.Since(a.started).Milliseconds())}
	for _, c := range checks {
		s.Status = max(s.Status, c.Status)
	}
	return s
}

func truncate(s string) string { return wire.TruncateUTF8(s, health.MaxCheckMessage) }

// diskCheck tries a write in the spool directory (roles without one have
// nothing to check).
func (a *Agent) diskCheck() health.HealthCheckV1 {
	c := health.HealthCheckV1{Name: "disk", Status: health.Healthy, Message: "no spool directory (this role keeps no state)"}
	if a.spool == "" {
		return c
	}
	f, err := os.CreateTemp(a.spool, ".health-*")
	if err != nil {
		c.Status, c.Message = health.Unhealthy, truncate("spool directory not writable: "+filepath.Base(a.spool))
		return c
	}
	name := f.Name()
	_, werr := f.Write([]byte("ok"))
	cerr := f.Close()
	_ = os.Remove(name)
	if werr != nil || cerr != nil {
		c.Status, c.Message = health.Unhealthy, "spool directory write failed"
		return c
	}
	c.Message = "spool directory writable"
	return c
}

// answerProbe runs the requested probe off the read goroutine and answers
// the request with its result (a ProbeResponseV1 correlated to it).
func (a *Agent) answerProbe(l *link, env *wire.Envelope, k health.ProbeKind) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		ctx, cancel := context.WithTimeout(l.ctx, a.cfg.RequestTimeout)
		defer cancel()
		start := time.Now()
		s := a.probe(ctx, l, k)
		a.st.healthProbes.Add(1)
		resp := &health.ProbeResponseV1{Probe: k, Summary: s, DurationMs: uint32(min(time.Since(start).Milliseconds(), 1<<31))}
		if err := resp.Validate(); err != nil {
			_ = l.ch.Reply(env, &admin.AdminAckV1{Acked: admin.MsgRunHealthProbe, Message: "probe result invalid"})
			return
		}
		_ = l.ch.Reply(env, resp)
	}()
}

// reportHealth sends the summary of a full probe once the link is up.
func (a *Agent) reportHealth(ctx context.Context, l *link) {
	s := a.probe(ctx, l, health.ProbeFull)
	if s.Validate() == nil && ctx.Err() == nil {
		_, _ = l.ch.SendMsg(&s)
	}
}
