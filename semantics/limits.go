package semantics

import (
	"cmp"
	"fmt"
	"log/slog"
	"math"
	"time"

	"forgeyard.dev/transport/wire"
)

// Limits bounds what one connection may use (§126–137, §275): the one
// per-connection limits type of every role (the daemon's daemon.Limits.Conn,
// the agent's agent.Config.Limits, the backends' Config.Limits). Both sides
// enforce them: the opener never exceeds the peer's advertised limits, and
// the receiver refuses a stream over a limit at stream level (StreamRefused)
// and closes the connection with CloseLimitExceeded when the peer persists.
//
// The zero value means "use the default" for every field; Validate reports
// negative values, and WithDefaults fills zero fields (DefaultLimits is the
// zero value filled). Limits are copied on entry: changing a Limits after
// passing it has no effect.
//
// Every limit, its default and what enforces it:
//
//	MaxStreams          256 (DefaultMaxStreams)       semantics.Conn: streams over it refused (StreamRefused);
//	                                                  the backend's stream credit is StreamCredit() (below)
//	MaxStreamsPerKind   DefaultStreamsPerKind         semantics.Conn, per kind (control 1, heartbeat 1, log 64,
//	                                                  CAS upload/download 16 each, diagnostic/device/signing/secret 4)
//	MaxFrame            wire.StreamKind.FrameLimit()  semantics.Stream frame reader (a larger frame: protocol error)
//	ControlQueue        64 frames                     semantics.Conn's priority scheduler, control class
//	LogQueue            1024 frames                   the same, log class
//	CasQueue            64 frames                     the same, CAS class
//	MaxRefusals         16                            semantics.Conn: more refusals (less one per admitted stream)
//	                                                  close the connection with CloseLimitExceeded
//	HeaderTimeout       10s                           semantics.Conn: an accepted stream's StreamHeader deadline
//	BulkChunk           16 KiB (TLS+yamux: 64 KiB)    semantics.Stream: largest bulk write between control checks
//	ControlRate         2000/s burst 4000             semantics/daemon (ratelimit.go): every control message
//	HeartbeatRate       20/s burst 40                 semantics/daemon: HeartbeatV1
//	HealthRate          10/s burst 20                 semantics/daemon: health-family requests
//	CasRate             500/s burst 1000              semantics/daemon: NeedObjectsV1 batches and CAS streams
//	IdentityRate        1/min burst 4                 semantics/daemon: CertificateRequestV1
//	MaxRateStrikes      256                           semantics/daemon: rate-limited messages (less one per
//	                                                  admitted message) before CloseLimitExceeded
//
// Stream credit: a backend grants the peer StreamCredit() streams of each
// direction type (QUIC MAX_STREAMS in backends/quic and
// backends/webtransport, the accept backlog and stream cap in
// backends/yamux, MaxIncomingStreams in backends/memory): MaxStreams +
// MaxRefusals, 272 for the defaults, so every stream the limits admit is
// admitted by the backend too and the refusals that escalate to
// CloseLimitExceeded stay observable. Every backend derives it from the
// Limits in its Config; configure the backend with the same Limits as the
// semantics.Conn over it (forgeyard-daemon does, from [limits]:
// daemonsetup.Listen); NewConn warns when a backend reports less credit
// than MaxStreams (StreamCreditor).
type Limits struct {
	// MaxStreams bounds concurrently open incoming streams of all kinds.
	MaxStreams int
	// MaxStreamsPerKind bounds concurrently open incoming streams per kind.
	MaxStreamsPerKind [wire.NumStreamKinds]int
	// MaxFrame bounds a frame body per stream kind (bytes).
	MaxFrame [wire.NumStreamKinds]int
	// ControlQueue, LogQueue and CasQueue bound application queue depths
	// (frames) for the three traffic classes (§128–130).
	ControlQueue, LogQueue, CasQueue int
	// MaxRefusals is how many refused streams a peer may cause before the
	// connection is closed with CloseLimitExceeded.
	MaxRefusals int
	// HeaderTimeout bounds how long an accepted stream may take to deliver
	// its StreamHeader.
	HeaderTimeout time.Duration
	// BulkChunk is the largest single write of a bulk (log/CAS) stream
	// between two checks for pending control writes. Zero takes the
	// backend's BulkChunkHinter preference, else DefaultBulkChunk.
	BulkChunk int

	// Per-connection message rates (§266–269), enforced by the side that
	// serves the messages (the daemon; an agent ignores them). A message
	// over its rate is not acted on and is answered with WireErrorV1
	// {RateLimited, RetryBackoff}; a CAS stream over CasRate is reset with
	// StreamRefused.
	//
	// ControlRate: every message on the control stream.
	ControlRate Rate
	// HeartbeatRate: HeartbeatV1 (an excessive heartbeat does not count
	// as liveness, §267).
	HeartbeatRate Rate
	// HealthRate: health-family requests.
	HealthRate Rate
	// CasRate: NeedObjectsV1 batches and CAS streams opened.
	CasRate Rate
	// IdentityRate: CertificateRequestV1 (enrollment and renewal). Each
	// one signs a certificate and records it in the authority, so a
	// runner renewing in a loop would grow the authority without bound;
	// a healthy runner renews once per two thirds of its certificate's
	// lifetime.
	IdentityRate Rate
	// MaxRateStrikes: rate-limited messages (less one per admitted message)
	// a connection may accumulate before it is closed with
	// CloseLimitExceeded.
	MaxRateStrikes int
}

// Rate is a token bucket: PerSecond on average, bursts of Burst. The zero
// value means "use the default".
type Rate struct {
	PerSecond float64
	Burst     int
}

// String renders the rate as "N/s burst B".
func (r Rate) String() string {
	if r.PerSecond > 0 && r.PerSecond < 1 {
		return fmt.Sprintf("%.3g/min burst %d", r.PerSecond*60, r.Burst)
	}
	return fmt.Sprintf("%g/s burst %d", r.PerSecond, r.Burst)
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (r Rate) LogValue() slog.Value { return slog.StringValue(r.String()) }

// Default limits.
const (
	DefaultMaxStreams     = 256
	DefaultControlQueue   = 64
	DefaultLogQueue       = 1024
	DefaultCasQueue       = 64
	DefaultMaxRefusals    = 16
	DefaultHeaderTimeout  = 10 * time.Second
	DefaultBulkChunk      = 16 << 10
	DefaultMaxRateStrikes = 256
)

// Default per-connection rates. They are generous for a well-behaved
// agent (a heartbeat every 10 s, a renewal per lease every 10 s, a few
// messages per attempt) and bound a flooding one.
var (
	DefaultControlRate   = Rate{PerSecond: 2000, Burst: 4000}
	DefaultHeartbeatRate = Rate{PerSecond: 20, Burst: 40}
	DefaultHealthRate    = Rate{PerSecond: 10, Burst: 20}
	DefaultCasRate       = Rate{PerSecond: 500, Burst: 1000}
	DefaultIdentityRate  = Rate{PerSecond: 1.0 / 60, Burst: 4}
)

// DefaultStreamsPerKind is the default per-kind incoming stream limit.
var DefaultStreamsPerKind = [wire.NumStreamKinds]int{
	wire.StreamControl:     1,
	wire.StreamHeartbeat:   1,
	wire.StreamLog:         64,
	wire.StreamCasUpload:   16,
	wire.StreamCasDownload: 16,
	wire.StreamDiagnostic:  4,
	wire.StreamDevice:      4,
	wire.StreamSigning:     4,
	wire.StreamSecret:      4,
}

// DefaultLimits returns the default limits: the zero Limits with every
// field filled (WithDefaults).
func DefaultLimits() Limits { return Limits{}.WithDefaults() }

// StreamCredit is the stream credit a backend grants the peer per
// direction type (bidirectional, unidirectional) for connections whose
// semantics.Conn enforces l: MaxStreams + MaxRefusals with the defaults
// filled (272 for the zero Limits). It is above MaxStreams so that
// semantics.Conn, not the backend's flow control, refuses the excess: a
// peer blocked by the backend's credit cannot be refused, counted or
// closed with CloseLimitExceeded.
func (l Limits) StreamCredit() int {
	l = l.WithDefaults()
	return l.MaxStreams + l.MaxRefusals
}

// InvalidLimitError is the error of a limit that breaks its rule: the one
// error type of Limits.Validate, Rate.Validate and semantics/daemon's
// Limits.Validate, which hold the rules of every limit (a configuration
// layer keeps no copy of them; it maps Field to its own key, e.g.
// internal/setup/daemonsetup to the TOML key of forgeyard-daemon).
type InvalidLimitError struct {
	// Type is the validated type: "semantics.Limits", "daemon.Limits".
	Type string
	// Field is the Go path of the field from Type: "MaxStreams",
	// "ControlRate.Burst", "MaxFrame[log]" (an array element names its
	// index); from daemon.Limits "Conn.MaxStreams",
	// "Admission.MaxHandshakes", "Data.LogRateBytes".
	Field string
	// Value is the field's value.
	Value any
	// Rule is what the value must be and what zero means, e.g. "must not
	// be negative (0: the default)".
	Rule string
}

// Error returns "TYPE.FIELD = VALUE: RULE".
func (e *InvalidLimitError) Error() string {
	return fmt.Sprintf("%s.%s = %v: %s", e.Type, e.Field, e.Value, e.Rule)
}

// The rules of the limits.
const (
	ruleNotNegative       = "must not be negative (0: the default)"
	ruleNotNegativeNumber = "must be a number, not negative (0: the default)"
)

// Validate reports the first field that breaks its rule (every field in
// declaration order; negative values, a frame limit above
// wire.MaxAnyFrame, a NaN rate) as an *InvalidLimitError.
func (l *Limits) Validate() error {
	if e := l.check(); e != nil {
		e.Type = "semantics.Limits"
		return e
	}
	return nil
}

// check is Validate with an *InvalidLimitError whose Type is not set.
func (l *Limits) check() *InvalidLimitError {
	bad := func(field string, v any, rule string) *InvalidLimitError {
		return &InvalidLimitError{Field: field, Value: v, Rule: rule}
	}
	if l.MaxStreams < 0 {
		return bad("MaxStreams", l.MaxStreams, ruleNotNegative)
	}
	for k, v := range l.MaxStreamsPerKind {
		if v < 0 {
			return bad(fmt.Sprintf("MaxStreamsPerKind[%s]", wire.StreamKind(k)), v, ruleNotNegative)
		}
	}
	for k, v := range l.MaxFrame {
		if v < 0 || v > wire.MaxAnyFrame {
			return bad(fmt.Sprintf("MaxFrame[%s]", wire.StreamKind(k)), v,
				fmt.Sprintf("must be within 0..%d (0: the stream kind's frame limit)", wire.MaxAnyFrame))
		}
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"ControlQueue", l.ControlQueue}, {"LogQueue", l.LogQueue}, {"CasQueue", l.CasQueue}, {"MaxRefusals", l.MaxRefusals}} {
		if f.v < 0 {
			return bad(f.name, f.v, ruleNotNegative)
		}
	}
	if l.HeaderTimeout < 0 {
		return bad("HeaderTimeout", l.HeaderTimeout, ruleNotNegative)
	}
	if l.BulkChunk < 0 {
		return bad("BulkChunk", l.BulkChunk, ruleNotNegative)
	}
	for _, r := range []struct {
		name string
		r    Rate
	}{{"ControlRate", l.ControlRate}, {"HeartbeatRate", l.HeartbeatRate}, {"HealthRate", l.HealthRate}, {"CasRate", l.CasRate}, {"IdentityRate", l.IdentityRate}} {
		if e := r.r.check(r.name + "."); e != nil {
			return e
		}
	}
	if l.MaxRateStrikes < 0 {
		return bad("MaxRateStrikes", l.MaxRateStrikes, ruleNotNegative)
	}
	return nil
}

// Validate reports a negative or NaN PerSecond or a negative Burst as a
// *InvalidLimitError (Type "semantics.Rate", Field "PerSecond" or "Burst"): the
// rule of every Rate field of a limits type, here and in
// semantics/daemon.
func (r Rate) Validate() error {
	if e := r.check(""); e != nil {
		e.Type = "semantics.Rate"
		return e
	}
	return nil
}

// check is Validate with fields named prefix+"PerSecond" and
// prefix+"Burst" and no Type.
func (r Rate) check(prefix string) *InvalidLimitError {
	if r.PerSecond < 0 || math.IsNaN(r.PerSecond) {
		return &InvalidLimitError{Field: prefix + "PerSecond", Value: r.PerSecond, Rule: ruleNotNegativeNumber}
	}
	if r.Burst < 0 {
		return &InvalidLimitError{Field: prefix + "Burst", Value: r.Burst, Rule: ruleNotNegative}
	}
	return nil
}

// WithDefaults returns a copy of l with zero fields set to defaults.
// A plain zero-means-default field is one cmp.Or (as in backends/quic's and
// backends/yamux's Config.withDefaults).
func (l Limits) WithDefaults() Limits {
	l.MaxStreams = cmp.Or(l.MaxStreams, DefaultMaxStreams)
	for k := range l.MaxStreamsPerKind {
		if l.MaxStreamsPerKind[k] == 0 {
			l.MaxStreamsPerKind[k] = DefaultStreamsPerKind[k]
		}
		if l.MaxFrame[k] == 0 {
			l.MaxFrame[k] = wire.StreamKind(k).FrameLimit()
		}
	}
	l.ControlQueue = cmp.Or(l.ControlQueue, DefaultControlQueue)
	l.LogQueue = cmp.Or(l.LogQueue, DefaultLogQueue)
	l.CasQueue = cmp.Or(l.CasQueue, DefaultCasQueue)
	l.MaxRefusals = cmp.Or(l.MaxRefusals, DefaultMaxRefusals)
	l.HeaderTimeout = cmp.Or(l.HeaderTimeout, DefaultHeaderTimeout)
	l.BulkChunk = cmp.Or(l.BulkChunk, DefaultBulkChunk)
	rate := func(r *Rate, def Rate) {
		r.PerSecond = cmp.Or(r.PerSecond, def.PerSecond)
		if r.Burst == 0 {
			r.Burst = max(1, int(r.PerSecond*float64(def.Burst)/def.PerSecond))
		}
	}
	rate(&l.ControlRate, DefaultControlRate)
	rate(&l.HeartbeatRate, DefaultHeartbeatRate)
	rate(&l.HealthRate, DefaultHealthRate)
	rate(&l.CasRate, DefaultCasRate)
	rate(&l.IdentityRate, DefaultIdentityRate)
	l.MaxRateStrikes = cmp.Or(l.MaxRateStrikes, DefaultMaxRateStrikes)
	return l
}
