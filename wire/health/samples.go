package health

import "forgeyard.dev/transport/wire"

// Samples returns one deterministic, fully populated, valid instance of every
// health message, plus extra instances so that every enum variant appears.
// Nothing depends on the clock or randomness. Each call returns fresh values.
func Samples() []wire.Message {
	degraded := HealthSummaryV1{
		Status: Degraded,
		Checks: []HealthCheckV1{
			{Name: "daemon-reachable", Status: Healthy, Message: "quic 203.0.113.7:7443 rtt 12ms"},
			{Name: "work-disk", Status: Degraded, Message: "9% free on /var/lib/forgeyard"},
		},
		UptimeMs: 86_400_000,
	}
	m := []wire.Message{
		&degraded,
		&HealthSummaryV1{Status: Unhealthy, Checks: []HealthCheckV1{
			{Name: "clock", Status: Unhealthy, Message: "offset 4.2s exceeds 1s"},
		}, UptimeMs: 5_000},
		&HealthSummaryV1{Status: Healthy, Checks: []HealthCheckV1{{Name: "all", Status: Healthy, Message: "ok"}}, UptimeMs: 1},
	}
	for k := ProbeKind(0); k < numProbeKinds; k++ {
		m = append(m, &ProbeRequestV1{Probe: k})
	}
	return append(m, &ProbeResponseV1{Probe: ProbeFull, Summary: HealthSummaryV1{
		Status: Degraded,
		Checks: []HealthCheckV1{
			{Name: "connectivity", Status: Healthy, Message: "3/3 endpoints"},
			{Name: "disk", Status: Degraded, Message: "9% free"},
			{Name: "clock", Status: Healthy, Message: "offset 3ms"},
		},
		UptimeMs: 86_400_000,
	}, DurationMs: 412})
}
