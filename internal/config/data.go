package config

import (
	"errors"
	"fmt"
)

// Data configures the daemon's data plane: where received logs and CAS
// objects go, and the per-attempt and per-connection limits on them
// (§127, §134, §268, §277). Zero values take the library defaults.
//
//	[data]
//	log_dir = "/var/lib/forgeyard/logs"    # without it log streams are refused
//	cas_dir = "/var/lib/forgeyard/cas"     # without it CAS streams are refused
//	log_rate_bytes = 1048576               # per attempt, bytes/s (0: unlimited)
//	log_burst_bytes = 262144
//	max_attempt_log_bytes = 1073741824     # per attempt (0: 1 GiB; -1: none)
//	cas_max_concurrent = 64                # transfers over the daemon
//	cas_max_per_conn = 16                  # transfers per connection
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

// Admission configures the daemon's admission control (§220–223). Zero
// values take the defaults; the per-IP limit is off unless set.
//
//	[admission]
//	max_handshakes = 256          # connected but not yet registered
//	registration_rate = 100       # registrations per second over the daemon
//	registration_burst = 200
//	max_conns_per_ip = 0          # supplement only: runners share NATs
type Admission struct {
	MaxHandshakes     int     `toml:"max_handshakes"`
	RegistrationRate  float64 `toml:"registration_rate"`
	RegistrationBurst int     `toml:"registration_burst"`
	MaxConnsPerIP     int     `toml:"max_conns_per_ip"`
}

// Validate reports the first out-of-range value, naming its key.
func (a Admission) Validate() error {
	if a.MaxHandshakes < 0 || a.RegistrationRate < 0 || a.RegistrationBurst < 0 || a.MaxConnsPerIP < 0 {
		return errors.New("admission: max_handshakes, registration_rate, registration_burst and max_conns_per_ip must be ≥ 0 (0: default / off)")
	}
	return nil
}
