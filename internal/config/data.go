package config

import (
	"errors"
	"fmt"
	"strings"

	"forgeyard.dev/transport/semantics"
)

// Data configures the daemon's data plane: where received logs and CAS
// objects go, and the per-attempt and per-connection limits on them
// (§127, §134, §268, §277), daemon.Limits.Data (daemonsetup.Limits converts and validates it). Zero values
// take the daemon's defaults, shown here.
//
//	[data]
//	log_dir = "/var/lib/forgeyard/logs"    # default: logs beside --dev-pki or the SQLite authority
//	cas_dir = "/var/lib/forgeyard/cas"     # without it CAS streams are refused
//	log_rate_bytes = 1048576               # per attempt, bytes/s (0: unlimited, the default)
//	log_burst_bytes = 262144               # (0: the larger of one log chunk and log_rate_bytes)
//	max_attempt_log_bytes = 1073741824     # per attempt (0: 1 GiB; -1: none)
//	cas_max_concurrent = 64                # transfers over the daemon (0: 64)
//	cas_max_per_conn = 16                  # transfers per connection (0: 16)
//	store = "local"                        # "local" (log_dir, cas_dir) or "s3" ([data.s3], shared by HA daemons)
//
//	[data.s3]                              # with store = "s3": logs under <prefix>logs/, objects under <prefix>cas/
//	endpoint = "s3.example.net:9000"       # host:port, no scheme
//	bucket = "forgeyard"                   # must exist
//	region = "us-east-1"
//	prefix = "prod/"                       # optional
//	access_key_id = "AKIA..."
//	secret_access_key_file = "/etc/forgeyard/s3-secret"   # the secret itself is never in the TOML
//	insecure = false                       # plain HTTP (loopback/testing only)
//	ca_file = ""                           # PEM CAs for the server's certificate (default: system pool)
//	path_style = true                      # endpoint/bucket addressing (most self-hosted servers)
//	timeout = "30s"                        # per request
//
//	[data.retention]                       # off unless max_age or max_bytes is set
//	max_age = "720h"                       # delete logs and objects older than this
//	max_bytes = 107374182400               # then the oldest until logs + objects fit
//	interval = "10m"                       # how often the collector runs (0: 10m)
//	partial_max_age = "24h"                # abandoned partial uploads (0: 24h; keep it > lease TTL)
type Data struct {
	LogDir             string    `toml:"log_dir"`
	CASDir             string    `toml:"cas_dir"`
	Store              string    `toml:"store"`
	S3                 S3        `toml:"s3"`
	Retention          Retention `toml:"retention"`
	LogRateBytes       float64   `toml:"log_rate_bytes"`
	LogBurstBytes      int64     `toml:"log_burst_bytes"`
	MaxAttemptLogBytes int64     `toml:"max_attempt_log_bytes"`
	CASMaxConcurrent   int       `toml:"cas_max_concurrent"`
	CASMaxPerConn      int       `toml:"cas_max_per_conn"`
}

// S3 is [data.s3], the shared object store.
type S3 struct {
	Endpoint            string   `toml:"endpoint"`
	Bucket              string   `toml:"bucket"`
	Region              string   `toml:"region"`
	Prefix              string   `toml:"prefix"`
	AccessKeyID         string   `toml:"access_key_id"`
	SecretAccessKeyFile string   `toml:"secret_access_key_file"`
	Insecure            bool     `toml:"insecure"`
	CAFile              string   `toml:"ca_file"`
	PathStyle           bool     `toml:"path_style"`
	Timeout             Duration `toml:"timeout"`
}

// Retention is [data.retention], the garbage collection of logs and CAS
// objects (semantics/daemon Retention).
type Retention struct {
	MaxAge        Duration `toml:"max_age"`
	MaxBytes      int64    `toml:"max_bytes"`
	Interval      Duration `toml:"interval"`
	PartialMaxAge Duration `toml:"partial_max_age"`
}

// Stores: the values of data.store.
const (
	StoreLocal = "local"
	StoreS3    = "s3"
)

// Validate reports the first out-of-range value of the store and retention
// keys, naming its key. The limit keys (log_rate_bytes, log_burst_bytes,
// max_attempt_log_bytes, cas_max_concurrent, cas_max_per_conn) are
// validated with the daemon's rules by daemonsetup.Limits.
func (d Data) Validate() error {
	switch d.Store {
	case "", StoreLocal:
	case StoreS3:
		s := d.S3
		switch {
		case s.Endpoint == "":
			return errors.New("data.s3.endpoint is required with data.store = \"s3\"")
		case strings.Contains(s.Endpoint, "://"):
			return fmt.Errorf("data.s3.endpoint %q: give host:port without a scheme (data.s3.insecure selects plain HTTP)", s.Endpoint)
		case s.Bucket == "":
			return errors.New("data.s3.bucket is required with data.store = \"s3\"")
		case s.AccessKeyID == "":
			return errors.New("data.s3.access_key_id is required with data.store = \"s3\"")
		case s.SecretAccessKeyFile == "":
			return errors.New("data.s3.secret_access_key_file is required with data.store = \"s3\" (the secret is read from that file)")
		case s.Timeout.Duration < 0:
			return errors.New("data.s3.timeout must be ≥ 0")
		case d.LogDir != "" || d.CASDir != "":
			return errors.New("data.log_dir and data.cas_dir are for data.store = \"local\"; with \"s3\" logs and objects go to [data.s3]")
		}
	default:
		return fmt.Errorf("data.store %q: use \"local\" or \"s3\"", d.Store)
	}
	r := d.Retention
	switch {
	case r.MaxAge.Duration < 0:
		return errors.New("data.retention.max_age must be ≥ 0 (0: no age limit)")
	case r.MaxBytes < 0:
		return errors.New("data.retention.max_bytes must be ≥ 0 (0: no size limit)")
	case r.Interval.Duration < 0:
		return errors.New("data.retention.interval must be ≥ 0 (0: 10m)")
	case r.PartialMaxAge.Duration < 0:
		return errors.New("data.retention.partial_max_age must be ≥ 0 (0: 24h)")
	}
	return nil
}

// Admission configures the daemon's admission control (§220–223),
// daemon.Limits.Admission (daemonsetup.Limits converts and validates it). Zero values take the
// daemon's defaults, shown here; the per-IP limit is off unless set.
//
//	[admission]
//	max_handshakes = 1024         # connected but not yet registered
//	registration_rate = 2000      # registrations per second over the daemon
//	registration_burst = 4000     # (0: twice registration_rate)
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

// ConnLimits configures what one connection may send (§126–137,
// §266–269), semantics.Limits (SemanticsLimits; daemon.Limits.Conn, which
// daemonsetup.Limits validates). A message over its rate is answered
// WireErrorV1{RateLimited, RetryBackoff} and not acted on; a connection
// that keeps exceeding them (max_rate_strikes) is closed with
// LimitExceeded. Zero values take the defaults shown (semantics.Default*).
// max_streams also sets the backends' stream credit (max_streams + 16
// refusals per direction type). A burst left 0 scales the default burst
// with the rate.
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
