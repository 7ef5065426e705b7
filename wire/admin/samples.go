package admin

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/health"
)

// Samples returns one deterministic, fully populated, valid instance of every
// admin message, plus extra instances so that every enum variant (every
// probe kind, both ack verdicts) appears. Each call returns fresh values.
func Samples() []wire.Message {
	m := []wire.Message{
		&DrainV1{Reason: "kernel upgrade on build-host-17", DeadlineMs: 3_600_000},
		&ResumeV1{},
		&RefreshCapabilitiesV1{},
	}
	for _, k := range []health.ProbeKind{health.ProbeConnectivity, health.ProbeDisk, health.ProbeClock, health.ProbeFull} {
		m = append(m, &RunHealthProbeV1{Probe: k})
	}
	return append(m,
		&AdminAckV1{Acked: MsgDrain, Accepted: true, Message: "draining: 2 attempts running"},
		&AdminAckV1{Acked: MsgRunHealthProbe, Accepted: false, Message: "probe already running"},
	)
}
