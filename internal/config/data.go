package config

import (
	"errors"
	"fmt"

	"forgeyard.dev/transport/semantics"
)

// Data configures the daemon's data plane: where received logs and CAS
// objects go, and the per-attempt and per-connection limits on them
// (§127, §134, §268, §277), daemon.Limits.Data (daemonsetup.Limits converts it). Zero values
// take the daemon's defaults, shown here.
//
//	[data]
//	log_dir = "/var/lib/forgeyard/logs"    # without it log streams are refused
//	cas_dir = "/var/lib/forgeyard/cas"     # without it CAS streams are refused
//	log_rate_bytes = 1048576               # per attempt, bytes/s (0: unlimited, the default)
//	log_burst_bytes = 262144               # (0: the larger of one log chunk and log_rate_bytes)
//	max_attempt_log_bytes = 1073741824     # per attempt (0: 1 GiB; -1: none)
//	cas_max_concurrent = 64                # transfers over the daemon (0: 64)
//	cas_max_per_conn = 16                  # transfers per connection (0: 16)
type Data struct {
	LogDir             string  `toml:"log_dir"`
	CASDir             string  `toml:"cas_dir"`
	LogRateBytes       float64 `toml:"log_rate_bytes"`
	LogBurstBytes      int64   `toml:"log_burst_bytes"`
	MaxAttemptLogBytes int64   `toml:"max_attempt_log_bytes"`
	CASMaxConcurrent   int     `toml:"cas_max_concurrent"`
	CASMaxPerConn      int     `toml:"cas_max_per_conn"`
}

// Validate reports the first out-of-range value, naming its key.
func (d Data) Validate() error {
	switch {
	case d.LogRateBytes < 0:
		return errors.New("data.log_rate_bytes must be ≥ 0 (0: unlimited)")
	case d.LogBurstBytes < 0:
		return errors.New("data.log_burst_bytes must be ≥ 0")
	case d.MaxAttemptLogBytes < -1:
		return fmt.Errorf("data.max_attempt_log_bytes %d: use a size in bytes, 0 for the default or -1 for no cap", d.MaxAttemptLogBytes)
	case d.CASMaxConcurrent < 0 || d.CASMaxPerConn < 0:
		return errors.New("data.cas_max_concurrent and data.cas_max_per_conn must be ≥ 0 (0: default)")
	}
	return nil
}

// Admission configures the daemon's admission control (§220–223),
// daemon.Limits.Admission (daemonsetup.Limits converts it). Zero values take the
// daemon's defaults, shown here; the per-IP limit is off unless set.
//
//	[admission]
//	max_handshakes = 1024         # connected but not yet registered
//	registration_rate = 200       # registrations per second over the daemon
//	registration_burst = 400      # (0: twice registration_rate)
//	max_conns_per_ip = 0          # supplement only: runners share NATs
//	max_connections = 20000       # daemon-wide cap on connected transports (-1: none)
//	fd_headroom = 256             # file descriptors kept free: refuse connections before EMFILE
type Admission struct {
	MaxHandshakes     int     `toml:"max_handshakes"`
	RegistrationRate  float64 `toml:"registration_rate"`
	RegistrationBurst int     `toml:"registration_burst"`
	MaxConnsPerIP     int     `toml:"max_conns_per_ip"`
	MaxConnections    int     `toml:"max_connections"`
	FDHeadroom        int     `toml:"fd_headroom"`
}

// Validate reports the first out-of-range value, naming its key.
func (a Admission) Validate() error {
	if a.MaxHandshakes < 0 || a.RegistrationRate < 0 || a.RegistrationBurst < 0 || a.MaxConnsPerIP < 0 || a.FDHeadroom < 0 {
		return errors.New("admission: max_handshakes, registration_rate, registration_burst, max_conns_per_ip and fd_headroom must be ≥ 0 (0: default / off)")
	}
	if a.MaxConnections < -1 {
		return fmt.Errorf("admission.max_connections %d: use a count, 0 for the default or -1 for no cap", a.MaxConnections)
	}
	return nil
}

// ConnLimits configures what one connection may send (§126–137,
// §266–269), semantics.Limits (SemanticsLimits; daemon.Limits.Conn). A
// message over its rate is answered WireErrorV1{RateLimited,
// RetryBackoff} and not acted on; a connection that keeps exceeding them
// (max_rate_strikes) is closed with LimitExceeded. Zero values take the
// defaults shown (semantics.Default*). max_streams also sets the
// backends' stream credit (max_streams + 16 refusals per direction type).
// A burst left 0 scales the default burst with the rate.
//
//	[limits]
//	max_streams = 256                  # concurrently open incoming streams
//	control_rate = 2000                # control messages per second
//	control_burst = 4000
//	heartbeat_rate = 20                # heartbeats per second
//	heartbeat_burst = 40
//	health_rate = 10                   # health requests per second
//	health_burst = 20
//	cas_rate = 500                     # NeedObjects batches and CAS streams per second
//	cas_burst = 1000
//	certificate_rate_per_min = 1       # renewal requests per minute
//	certificate_burst = 4
//	max_rate_strikes = 256
type ConnLimits struct {
	MaxStreams            int     `toml:"max_streams"`
	ControlRate           float64 `toml:"control_rate"`
	ControlBurst          int     `toml:"control_burst"`
	HeartbeatRate         float64 `toml:"heartbeat_rate"`
	HeartbeatBurst        int     `toml:"heartbeat_burst"`
	HealthRate            float64 `toml:"health_rate"`
	HealthBurst           int     `toml:"health_burst"`
	CASRate               float64 `toml:"cas_rate"`
	CASBurst              int     `toml:"cas_burst"`
	CertificateRatePerMin float64 `toml:"certificate_rate_per_min"`
	CertificateBurst      int     `toml:"certificate_burst"`
	MaxRateStrikes        int     `toml:"max_rate_strikes"`
}

// SemanticsLimits converts [limits] (certificate_rate_per_min is per
// minute; semantics.Rate is per second).
func (l ConnLimits) SemanticsLimits() semantics.Limits {
	return semantics.Limits{
		MaxStreams:     l.MaxStreams,
		ControlRate:    semantics.Rate{PerSecond: l.ControlRate, Burst: l.ControlBurst},
		HeartbeatRate:  semantics.Rate{PerSecond: l.HeartbeatRate, Burst: l.HeartbeatBurst},
		HealthRate:     semantics.Rate{PerSecond: l.HealthRate, Burst: l.HealthBurst},
		CasRate:        semantics.Rate{PerSecond: l.CASRate, Burst: l.CASBurst},
		IdentityRate:   semantics.Rate{PerSecond: l.CertificateRatePerMin / 60, Burst: l.CertificateBurst},
		MaxRateStrikes: l.MaxRateStrikes,
	}
}

// Validate reports the first negative value, naming its key.
func (l ConnLimits) Validate() error {
	for _, f := range []struct {
		key string
		v   float64
	}{
		{"max_streams", float64(l.MaxStreams)},
		{"control_rate", l.ControlRate}, {"control_burst", float64(l.ControlBurst)},
		{"heartbeat_rate", l.HeartbeatRate}, {"heartbeat_burst", float64(l.HeartbeatBurst)},
		{"health_rate", l.HealthRate}, {"health_burst", float64(l.HealthBurst)},
		{"cas_rate", l.CASRate}, {"cas_burst", float64(l.CASBurst)},
		{"certificate_rate_per_min", l.CertificateRatePerMin}, {"certificate_burst", float64(l.CertificateBurst)},
		{"max_rate_strikes", float64(l.MaxRateStrikes)},
	} {
		if f.v < 0 || f.v != f.v {
			return fmt.Errorf("limits.%s = %v: must be ≥ 0 (0: default)", f.key, f.v)
		}
	}
	return nil
}
