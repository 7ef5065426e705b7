package daemonsetup

import (
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/daemon"
)

// Limits converts the [limits], [admission] and [data] sections to the
// daemon's one limits type, daemon.Limits (its doc lists every limit, its
// default and what enforces it), and validates it. Zero keys stay zero, so
// the daemon's defaults apply: neither package keeps a copy of them. Give
// Conn to the backends' Config too (their stream credit derives from it).
//
// The conversion lives here, not in internal/config, so that the agent and
// the relay, which read their configuration with internal/config, do not
// link the daemon engine.
func Limits(d *config.Daemon) (daemon.Limits, error) {
	l := daemon.Limits{Conn: d.Limits.SemanticsLimits(), Admission: admission(d.Admission), Data: data(d.Data)}
	if err := l.Validate(); err != nil {
		return l, &config.Error{Key: "limits", Msg: err.Error()}
	}
	return l, nil
}

// data converts the limits of [data] (not the directories).
func data(d config.Data) daemon.DataLimits {
	return daemon.DataLimits{LogRateBytes: d.LogRateBytes, LogBurstBytes: d.LogBurstBytes,
		MaxAttemptLogBytes: d.MaxAttemptLogBytes, CASMaxConcurrent: d.CASMaxConcurrent, CASMaxPerConn: d.CASMaxPerConn}
}

// admission converts [admission].
func admission(a config.Admission) daemon.Admission {
	return daemon.Admission{MaxHandshakes: a.MaxHandshakes, MaxConnsPerIP: a.MaxConnsPerIP,
		RegistrationRate: semantics.Rate{PerSecond: a.RegistrationRate, Burst: a.RegistrationBurst},
		MaxConnections:   a.MaxConnections, FDHeadroom: a.FDHeadroom}
}
