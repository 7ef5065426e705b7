package daemon

import (
	"cmp"
	"errors"
	"math"
	"reflect"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/logs"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// Limits are every limit the daemon enforces, decided in one place (in the
// spirit of libp2p's resource manager): what one connection may use
// (Conn), the daemon-wide admission control (Admission) and the data-plane
// quotas (Data). Config carries them as its Bounds field (its older
// Limits, Admission and Data fields are deprecated; AllLimits merges them);
// internal/config's [limits], [admission]
// and [data] sections convert to exactly this type. The zero value means
// the default for every field (DefaultLimits returns them filled);
// Validate reports the first invalid field; New validates them and fills
// the defaults.
//
// Every limit, its default and what enforces it (TOML key in brackets):
//
//	Conn (semantics.Limits, per connection; its doc has the full table):
//	  MaxStreams          256 [limits.max_streams]   semantics.Conn refuses streams over it (StreamRefused);
//	                                                 the backends' stream credit is MaxStreams + MaxRefusals (272)
//	  MaxStreamsPerKind   control 1, heartbeat 1, log 64, CAS up/down 16, other kinds 4    semantics.Conn
//	  MaxRefusals         16                         semantics.Conn: then CloseLimitExceeded
//	  HeaderTimeout       10s                        semantics.Conn
//	  ControlRate         2000/s burst 4000 [limits.control_rate, control_burst]     ratelimit.go, per connection:
//	  HeartbeatRate       20/s burst 40 [limits.heartbeat_rate, heartbeat_burst]     a message over its rate is answered
//	  HealthRate          10/s burst 20 [limits.health_rate, health_burst]           WireErrorV1{RateLimited, RetryBackoff,
//	  CasRate             500/s burst 1000 [limits.cas_rate, cas_burst]              "retry after …"} and not acted on
//	  IdentityRate        1/min burst 4 [limits.certificate_rate_per_min, certificate_burst]
//	  MaxRateStrikes      256 [limits.max_rate_strikes]   ratelimit.go: then CloseLimitExceeded
//	Admission (daemon-wide, admission.go):
//	  MaxHandshakes       1024 [admission.max_handshakes]     connected, not registered; at it: refused before the QUIC handshake, beyond 2×: CloseOverloaded
//	  RegistrationRate    2000/s burst 4000 [admission.registration_rate, registration_burst]
//	                                                 beyond: RegistrationRejectedV1{Overloaded, "retry after …"}
//	  MaxConnsPerIP       off [admission.max_conns_per_ip]    beyond: CloseOverloaded
//	Data (per attempt or per connection, logs.Receiver and cas.Server):
//	  LogRateBytes        unlimited [data.log_rate_bytes]      per attempt, bytes/s; over it the stream is not read
//	  LogBurstBytes       max(MaxLogChunk, LogRateBytes) [data.log_burst_bytes]
//	  MaxAttemptLogBytes  1 GiB [data.max_attempt_log_bytes]   beyond: the log stream is refused (quota)
//	  MaxLogAttempts      4096                                 attempts whose logs are tracked at once
//	  CASMaxConcurrent    64 [data.cas_max_concurrent]         CAS transfers over the daemon
//	  CASMaxPerConn       16 [data.cas_max_per_conn]           CAS transfers per connection
//	  CASBandwidth        unlimited                            bytes/s of every CAS transfer together
type Limits struct {
	Conn      semantics.Limits
	Admission Admission
	Data      DataLimits
}

// DefaultLimits returns the default limits, every field filled.
func DefaultLimits() Limits { return Limits{}.WithDefaults() }

// WithDefaults returns l with zero fields set to the defaults.
func (l Limits) WithDefaults() Limits {
	l.Conn = l.Conn.WithDefaults()
	l.Admission = l.Admission.withDefaults()
	l.Data = l.Data.withDefaults()
	return l
}

// Validate reports the first field that breaks its rule, in the order
// Conn, Admission, Data, as a *semantics.InvalidLimitError whose Field is the
// path from Limits ("Conn.MaxStreams", "Admission.RegistrationRate.Burst",
// "Data.LogRateBytes"). These are the only copy of the rules: a
// configuration layer maps Field to its own key
// (internal/setup/daemonsetup to the TOML key).
func (l *Limits) Validate() error {
	if err := l.Conn.Validate(); err != nil {
		return under("Conn.", err)
	}
	if err := l.Admission.validate(); err != nil {
		return under("Admission.", err)
	}
	if err := l.Data.validate(); err != nil {
		return under("Data.", err)
	}
	return nil
}

// under returns err, a *semantics.InvalidLimitError of a part of Limits, as one
// of Limits: Type "daemon.Limits", Field prefixed with the part.
func under(prefix string, err error) error {
	var le *semantics.InvalidLimitError
	if !errors.As(err, &le) {
		return err
	}
	return &semantics.InvalidLimitError{Type: limitsType, Field: prefix + le.Field, Value: le.Value, Rule: le.Rule}
}

// limitsType is InvalidLimitError.Type of Limits and its parts.
const limitsType = "daemon.Limits"

// notNegative is a *semantics.InvalidLimitError of field (of a part of Limits)
// when v is negative; zero says what 0 means.
func notNegative[T int | int64](field string, v T, zero string) error {
	if v < 0 {
		return &semantics.InvalidLimitError{Type: limitsType, Field: field, Value: v, Rule: "must not be negative (0: " + zero + ")"}
	}
	return nil
}

// AllLimits returns the limits c carries: Bounds, each part of it that is
// the zero value taken from the deprecated field of that part (Limits,
// Admission, Data), so a Config written before Bounds means what it meant.
func (c *Config) AllLimits() Limits {
	l := c.Bounds
	if reflect.ValueOf(l.Conn).IsZero() {
		l.Conn = c.Limits
	}
	if reflect.ValueOf(l.Admission).IsZero() {
		l.Admission = c.Admission
	}
	if reflect.ValueOf(l.Data).IsZero() {
		l.Data = c.Data
	}
	return l
}

// SetLimits sets c.Bounds to l and clears the deprecated Limits, Admission
// and Data fields, so that l is the one copy.
func (c *Config) SetLimits(l Limits) {
	c.Bounds = l
	c.Limits, c.Admission, c.Data = semantics.Limits{}, Admission{}, DataLimits{}
}

// Admission is the daemon-wide admission control of §220–223. Zero fields
// take the defaults; the per-IP limit is off unless set.
type Admission struct {
	// MaxHandshakes bounds the connections that are connected but not yet
	// registered (§221). At it, a listener that asks AdmitEarly (QUIC)
	// refuses new attempts before their handshake; a connection whose
	// handshake completed anyway is served up to twice the cap, beyond
	// which it is closed at once with CloseOverloaded, before its control
	// stream is read. Below the cap the backlog is also bounded by time:
	// AdmitEarly refuses while the connections awaiting registration
	// would take more than 4 s to register at the rate this daemon was
	// measured registering them (a herd whose registrations are slower
	// than its handshakes waits before its handshake, not after it).
	MaxHandshakes int
	// RegistrationRate bounds handshakes (TransportHelloV1, the start of a
	// registration) per second over the whole daemon, e.g. the herd of
	// reconnects after a restart (§219–220). A hello beyond it is answered
	// with RegistrationRejectedV1{Overloaded, RetryBackoff, "retry after
	// …"} and the connection closed with CloseOverloaded; the agent backs
	// off with jitter and retries. A zero Burst is twice the rate.
	RegistrationRate semantics.Rate
	// MaxConnsPerIP bounds concurrent connections from one IP address (a
	// supplement only, §223: many runners may share a NAT). 0 means no
	// limit. A connection beyond it is closed with CloseOverloaded.
	MaxConnsPerIP int
	// MaxConnections caps the transports connected to this daemon at once,
	// registered or not. A connection attempt beyond it is refused: before
	// its QUIC handshake where the listener asks AdmitEarly, else with
	// CloseOverloaded at connect, and a hello with
	// RegistrationRejectedV1{Overloaded, RetryBackoff}. 0:
	// DefaultMaxConnections; negative: no cap.
	MaxConnections int
	// FDHeadroom is the file descriptors kept free for everything but new
	// connections (log and CAS files, authority connections, the admin
	// endpoint) when Config.OpenFiles is set: while fewer are left, new
	// connections and registrations are refused as over MaxConnections,
	// before accept(2) starts failing with EMFILE (0: DefaultFDHeadroom).
	FDHeadroom int
}

// Admission defaults.
const (
	DefaultMaxHandshakes = 1024
	// DefaultMaxConnections is the default daemon-wide connection cap:
	// above the 10,000 agents one 2-core daemon is measured with
	// (docs/perf.md, the scale table), below where its memory would run
	// out.
	DefaultMaxConnections = 20000
	// DefaultFDHeadroom is the default descriptor headroom.
	DefaultFDHeadroom = 256
)

// DefaultRegistrationRate is the default daemon-wide registration rate:
// above the rate one daemon completes handshakes (~600/s on the 2-core
// machine of docs/perf.md, where a registration costs a few per cent of
// a handshake's CPU), so that a herd is paced before its handshakes —
// by the transport's handshake queue, where a refusal costs one packet —
// and not after them, where a deferred registration throws a paid
// handshake away.
var DefaultRegistrationRate = semantics.Rate{PerSecond: 2000, Burst: 4000}

func (a Admission) withDefaults() Admission {
	if a.MaxHandshakes <= 0 {
		a.MaxHandshakes = DefaultMaxHandshakes
	}
	a.MaxConnections = cmp.Or(a.MaxConnections, DefaultMaxConnections)
	if a.FDHeadroom <= 0 {
		a.FDHeadroom = DefaultFDHeadroom
	}
	if a.RegistrationRate.PerSecond <= 0 {
		a.RegistrationRate.PerSecond = DefaultRegistrationRate.PerSecond
	}
	if a.RegistrationRate.Burst <= 0 {
		a.RegistrationRate.Burst = max(1, int(a.RegistrationRate.PerSecond*2))
	}
	return a
}

// validate reports the first negative field (MaxConnections may be:
// no cap) or NaN rate as a *semantics.InvalidLimitError with Field relative to
// Admission.
func (a Admission) validate() error {
	if err := notNegative("MaxHandshakes", a.MaxHandshakes, "the default"); err != nil {
		return err
	}
	if err := a.RegistrationRate.Validate(); err != nil {
		return under("RegistrationRate.", err)
	}
	if err := notNegative("MaxConnsPerIP", a.MaxConnsPerIP, "off"); err != nil {
		return err
	}
	return notNegative("FDHeadroom", a.FDHeadroom, "the default")
}

// DataLimits are the daemon's quotas and rate limits on data streams. Every
// limit applies per attempt or per connection, so one misbehaving agent
// cannot take the daemon's memory, disk bandwidth or CAS slots from the
// others; excess is pushed back to the agent through stream flow control
// (rates) or refused with a stream error code (quotas), never buffered.
type DataLimits struct {
	// LogRateBytes limits each attempt's log to this many uncompressed
	// bytes per second (a token bucket of LogBurstBytes); the receiver
	// stops reading an attempt's stream while it is over. 0: unlimited.
	LogRateBytes float64
	// LogBurstBytes is the bucket size; at least wlogs.MaxLogChunk and
	// LogRateBytes (see logs.ReceiverConfig).
	LogBurstBytes int64
	// MaxAttemptLogBytes caps one attempt's log (§268): above it the
	// stream is refused. 0: logs.DefaultMaxAttemptBytes; negative: none.
	MaxAttemptLogBytes int64
	// MaxLogAttempts bounds the attempts whose logs are tracked at once.
	// 0: logs.DefaultMaxAttempts.
	MaxLogAttempts int
	// CASMaxConcurrent and CASMaxPerConn bound transfers in progress over
	// the daemon and per connection; 0: cas.DefaultServerMaxConcurrent and
	// cas.DefaultServerMaxPerConn.
	CASMaxConcurrent, CASMaxPerConn int
	// CASBandwidth paces every CAS transfer's bytes (both directions
	// together); nil is unlimited.
	CASBandwidth *cas.Bandwidth
}

// withDefaults fills the zero fields with the defaults of the log receiver
// and the CAS server (the values they would take themselves).
func (d DataLimits) withDefaults() DataLimits {
	if d.LogRateBytes > 0 {
		d.LogBurstBytes = max(d.LogBurstBytes, wlogs.MaxLogChunk, int64(d.LogRateBytes))
	}
	d.MaxAttemptLogBytes = cmp.Or(d.MaxAttemptLogBytes, logs.DefaultMaxAttemptBytes)
	d.MaxLogAttempts = cmp.Or(d.MaxLogAttempts, logs.DefaultMaxAttempts)
	d.CASMaxConcurrent = cmp.Or(d.CASMaxConcurrent, cas.DefaultServerMaxConcurrent)
	d.CASMaxPerConn = cmp.Or(d.CASMaxPerConn, cas.DefaultServerMaxPerConn)
	return d
}

// validate reports the first negative field (MaxAttemptLogBytes may be:
// no cap) or a NaN LogRateBytes as a *semantics.InvalidLimitError with Field
// relative to DataLimits.
func (d DataLimits) validate() error {
	if d.LogRateBytes < 0 || math.IsNaN(d.LogRateBytes) {
		return &semantics.InvalidLimitError{Type: limitsType, Field: "LogRateBytes", Value: d.LogRateBytes, Rule: "must be a number, not negative (0: unlimited)"}
	}
	for _, err := range []error{
		notNegative("LogBurstBytes", d.LogBurstBytes, "the default"),
		notNegative("MaxLogAttempts", d.MaxLogAttempts, "the default"),
		notNegative("CASMaxConcurrent", d.CASMaxConcurrent, "the default"),
		notNegative("CASMaxPerConn", d.CASMaxPerConn, "the default"),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

// validateLimits validates c's limits (AllLimits) and makes Bounds their
// one copy (New works on its own copy of the Config).
func (c *Config) validateLimits() error {
	l := c.AllLimits()
	if err := l.Validate(); err != nil {
		return err
	}
	c.SetLimits(l)
	return nil
}
