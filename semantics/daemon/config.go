package daemon

import (
	"cmp"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// Timing is the daemon's timing policy; the daemon sends it to every agent
// in RegistrationAcceptedV1. Zero fields take the Default* values.
type Timing struct {
	// HeartbeatInterval: how often agents send HeartbeatV1, at least (the
	// heartbeat budget may lengthen it, below). A transport without a
	// heartbeat for 3 of its intervals plus HeartbeatGrace is closed with
	// CloseIdleTimeout.
	HeartbeatInterval time.Duration
	// MaxHeartbeatsPerSecond is the daemon-wide heartbeat budget, as
	// Nomad's max_heartbeats_per_second: an agent registering while n
	// sessions are registered (itself included) is given the interval
	// clamp(n / MaxHeartbeatsPerSecond, HeartbeatInterval,
	// MaxHeartbeatInterval), so the fleet's heartbeat rate stays within
	// the budget as it grows (the interval of a session is fixed at its
	// registration). 0: DefaultMaxHeartbeatsPerSecond; negative: no
	// budget (always HeartbeatInterval).
	MaxHeartbeatsPerSecond float64
	// MaxHeartbeatInterval caps the budgeted interval (0:
	// DefaultMaxHeartbeatInterval; never below HeartbeatInterval).
	MaxHeartbeatInterval time.Duration
	// HeartbeatGrace is added to the 3 missed intervals before the daemon
	// closes a silent transport (Nomad's heartbeat_grace; 0: none).
	HeartbeatGrace time.Duration
	// RenewInterval: how often agents renew each live lease; also the
	// period of the daemon's expiry/dedup loop and of offer re-sends.
	RenewInterval time.Duration
	// LeaseTTL: default lease lifetime; each renewal extends to now+TTL.
	LeaseTTL time.Duration
	// RevokeGrace: how long past its expiry a lease lives on while the
	// daemon probes the agent (LeaseProbeV1) before revoking it.
	RevokeGrace time.Duration
	// RegistrationTimeout: a transport not registered this long after
	// connect is closed with CloseRegistrationTimeout (§60).
	RegistrationTimeout time.Duration
	// RequestTimeout: the deadline of every daemon request (cancel
	// delivery) and the agents' request deadline hint.
	RequestTimeout time.Duration
	// MaxBackoff: the agents' reconnect backoff ceiling.
	MaxBackoff time.Duration
	// FallbackStagger: the agents' happy-eyeballs class offsets, sent as
	// fallback_stagger_ms: entry i is how long after backend class i the
	// class i+1 starts (QUIC → WebTransport → TLS+yamux → relay; the last
	// entry repeats; at most 8 entries). It replaces the agents' own
	// (semantics/agent Fallback.ClassStagger).
	FallbackStagger []time.Duration
}

// Timing defaults.
const (
	DefaultHeartbeatInterval = 10 * time.Second
	// DefaultMaxHeartbeatInterval caps the budgeted heartbeat interval:
	// an agent of a dead daemon notices within 3 of them.
	DefaultMaxHeartbeatInterval = 60 * time.Second
	DefaultRenewInterval        = 10 * time.Second
	DefaultLeaseTTL             = 60 * time.Second
	DefaultRevokeGrace          = 15 * time.Second
	DefaultRegistrationTimeout  = 10 * time.Second
	DefaultRequestTimeout       = 10 * time.Second
	DefaultMaxBackoff           = 30 * time.Second
	DefaultDedupRetention       = 24 * time.Hour
)

// DefaultMaxHeartbeatsPerSecond is the default heartbeat budget: 10,000
// agents at the default 10 s interval; beyond that the interval grows.
const DefaultMaxHeartbeatsPerSecond = 1000.0

// DefaultFallbackStagger is the default happy-eyeballs stagger: QUIC at 0,
// WebTransport +250 ms, TLS+yamux +500 ms, relays +1 s (ARCHITECTURE.md
// decision 11; the same as semantics/agent DefaultClassStagger).
var DefaultFallbackStagger = []time.Duration{250 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond}

func (t Timing) withDefaults() Timing {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&t.HeartbeatInterval, DefaultHeartbeatInterval)
	def(&t.RenewInterval, DefaultRenewInterval)
	def(&t.LeaseTTL, DefaultLeaseTTL)
	def(&t.RevokeGrace, DefaultRevokeGrace)
	def(&t.RegistrationTimeout, DefaultRegistrationTimeout)
	def(&t.RequestTimeout, DefaultRequestTimeout)
	def(&t.MaxBackoff, DefaultMaxBackoff)
	def(&t.MaxHeartbeatInterval, DefaultMaxHeartbeatInterval)
	t.MaxHeartbeatInterval = max(t.MaxHeartbeatInterval, t.HeartbeatInterval)
	t.MaxHeartbeatsPerSecond = cmp.Or(t.MaxHeartbeatsPerSecond, DefaultMaxHeartbeatsPerSecond)
	if t.HeartbeatGrace < 0 {
		t.HeartbeatGrace = 0
	}
	if t.FallbackStagger == nil {
		t.FallbackStagger = DefaultFallbackStagger
	}
	t.FallbackStagger = append([]time.Duration(nil), t.FallbackStagger...)
	return t
}

// Config configures a Daemon. It is copied by New.
type Config struct {
	// ID names this daemon in the authority (which daemon holds a session).
	// Empty means a random name.
	ID string
	// Authority is the durable state (required).
	Authority authority.Authority
	// RunnerCAs verifies certificate chains agents send in
	// RegisterAgentV1.cert_chain (needed when a relay terminates TLS). Nil
	// means such chains are accepted only when they match a TLS-verified
	// peer.
	RunnerCAs *x509.CertPool
	// Protocol is the range this daemon speaks; zero means wire.Supported.
	Protocol wire.ProtocolRange
	// MinProtocol is a policy minimum (downgrade defence, §274): agents
	// whose best common version is below it are rejected like a version
	// mismatch. Zero means none.
	MinProtocol wire.ProtocolVersion
	// Features offered to agents; the ack carries the intersection.
	Features wire.FeatureSet
	// RestartTokenKey (at least 32 secret bytes) keys the restart tokens
	// given to QUIC and WebTransport agents that negotiated
	// wire.FeatureRestartTokenV1 (agentwire.RestartTokenV1,
	// semantics.DeriveRestartToken): after a crash, the restarted daemon
	// derives them again for the sessions its previous process held and
	// sends each in a restart hint, which ends the agent's link at once
	// (docs/protocols/internal/restart-hint.md). It must survive restarts
	// (forgeyard-daemon derives it from the QUIC stateless reset key).
	// Nil or shorter: no tokens; agents answer restart hints with a
	// heartbeat probe.
	RestartTokenKey []byte
	// Timing policy; zero fields are defaults.
	Timing Timing
	// AlternateEndpoints are sent to agents for reconnects and GoAway.
	AlternateEndpoints []string
	// Bounds are every limit the daemon enforces, in one value (Limits: what
	// one connection may use, the daemon-wide admission control, the data
	// plane's quotas; limits.go lists each with its default and what
	// enforces it). Zero fields take the defaults. Give the backends'
	// Config the same Bounds.Conn (their stream credit derives from it).
	Bounds Limits
	// Limits is the per-connection part of Bounds.
	//
	// Deprecated: set Bounds.Conn. It is used only while Bounds.Conn is
	// the zero value.
	Limits semantics.Limits
	// Admission is the admission part of Bounds.
	//
	// Deprecated: set Bounds.Admission. It is used only while
	// Bounds.Admission is the zero value.
	Admission Admission
	// OpenFiles, when not nil, reports the process's open file descriptors
	// and their limit (RLIMIT_NOFILE) for Admission.FDHeadroom. It is asked
	// at every connect and registration, so it must be cheap (a cached
	// sample: internal/setup/daemonsetup.OpenFiles). Nil: no descriptor
	// check.
	OpenFiles func() (open, limit int)
	// Logger receives operational and audit records; nil discards.
	Logger *slog.Logger
	// Now is the daemon clock; nil means time.Now.
	Now func() time.Time
	// DedupRetention: dedup records older than this are pruned (§79);
	// 0 means DefaultDedupRetention.
	DedupRetention time.Duration
	// Hooks observe the daemon.
	Hooks Hooks
	// LogSink stores the attempts' logs received on log streams (§83–86).
	// Nil with an empty LogDir means log streams are refused
	// (StreamRefused) and LogsFinalizedV1 is acknowledged at once.
	LogSink logs.LogSink
	// LogDir, when LogSink is nil, is the directory of a logs.FileSink the
	// daemon creates (and closes at Shutdown).
	LogDir string
	// ContentStore stores CAS objects agents upload (outputs) and serves
	// the ones they fetch (payloads) (§87–93). Nil means CAS streams are
	// refused and NeedObjectsV1 is answered with an error.
	ContentStore cas.ContentStore
	// Retention garbage-collects the logs of LogSink/LogDir and the objects
	// of ContentStore when they implement logs.Collector / cas.Collector
	// (FileSink, FSStore, BucketSink, BucketStore); the zero value keeps
	// everything.
	Retention Retention
	// HealthProbe configures the background probe of the authority and
	// the content store (Dependencies, /healthz, /readyz); the zero value
	// probes every DefaultProbeInterval with DefaultProbeTimeout.
	HealthProbe HealthProbe
	// Identity configures enrollment, certificate renewal and the
	// revocation check (enroll.go).
	Identity IdentityConfig
	// Data is the data-plane part of Bounds.
	//
	// Deprecated: set Bounds.Data. It is used only while Bounds.Data is
	// the zero value.
	Data DataLimits
	// Metrics, when set, is fed by the daemon and its connections: bytes,
	// streams and queue depths (semantics.Config.Metrics), messages and
	// protocol errors (control.Config.Metrics), registration failures,
	// fencing, the lease-offer, completion-ack and cancel-delivery
	// latencies (§207–209), and the log receiver's and CAS server's
	// counters. Nil disables them.
	Metrics *telemetry.Metrics
	// Tracing starts the daemon's spans (§210): transport.handshake,
	// protocol.negotiate, agent.register,
	// reconnect.resync, lease.dispatch, lease.ack (handling the answer),
	// attempt.complete, attempt.cancel, and cas.stream / log.stream per
	// data stream. The trace context is carried in
	// the envelope to agents that negotiated FeatureTraceContextV1 (offer
	// it in Features) and continued from theirs. Nil starts no spans.
	Tracing *telemetry.Tracing
}

// Hooks are called from daemon goroutines, synchronously with the event
// they describe; they must not block for long and must not call back into
// the Daemon's blocking methods. Nil hooks are skipped.
type Hooks struct {
	// OnRegistered: a registration was accepted (before the accept is sent).
	OnRegistered func(SessionInfo)
	// OnCompletion: the authority answered a completion; called after the
	// authority committed and before CompletionAckV1 is written.
	OnCompletion func(CompletionEvent)
	// OnPhase: an agent reported a phase change (PhaseChangeV1, or a
	// heartbeat re-asserting a phase the daemon had not seen). Repeats of
	// the last phase of an attempt are not reported.
	OnPhase func(PhaseEvent)
	// OnLeaseAnswer: an agent accepted or rejected an offer (duplicates
	// included, with Duplicate set).
	OnLeaseAnswer func(LeaseAnswerEvent)
	// OnDisconnect: a transport ended; err is its close error.
	OnDisconnect func(SessionInfo, error)
	// OnLogStream: an agent opened an authorized log stream for an
	// attempt (its header: first sequence number, encoding).
	OnLogStream func(wlogs.LogStreamHeaderV1)
	// OnCapabilities: the capabilities a runner reported — at every
	// accepted registration (right after OnRegistered) and when the agent
	// sends a CapabilityUpdateV1 snapshot. The value is the decoded,
	// bounds-checked wire value; the daemon keeps no copy (a scheduler
	// that matches jobs to runners keeps its own).
	OnCapabilities func(SessionInfo, agentwire.RunnerCapabilitiesV1)
	// OnOutputs: an agent declared an attempt's outputs final
	// (OutputsFinalizedV1, authorized against the attempt's lease), after
	// the daemon recorded them (FinalizedOutputs). Whether each object is
	// stored and verified is the content store's answer.
	OnOutputs func(OutputsEvent)
}

// OutputsEvent is an attempt's final list of declared outputs.
type OutputsEvent struct {
	Runner  wire.RunnerId
	Lease   wire.LeaseId
	Attempt wire.JobAttemptId
	Outputs []wire.CasObjectRef
}

// SessionInfo describes one transport and the agent session on it.
type SessionInfo struct {
	Runner        wire.RunnerId
	Session       wire.AgentSessionId
	Transport     wire.TransportSessionId
	Epoch         uint64
	Role          agentwire.PeerRole
	Backend       string
	Remote        string
	Protocol      wire.ProtocolVersion
	Features      wire.FeatureSet // negotiated (HelloAckV1.features)
	AgentVersion  string
	State         string
	Fenced        bool
	LastHeartbeat time.Time
	// HeartbeatInterval is the interval the session was given at
	// registration (Timing's heartbeat budget); 0 before registration.
	HeartbeatInterval time.Duration
	ConnectedAt       time.Time
	// TLSResumed: the transport's TLS session was resumed from a session
	// ticket (no certificate signatures in its handshake; identity and
	// revocation were checked at registration as on a full handshake).
	TLSResumed bool
}

// CompletionEvent is an attempt completion and the authority's answer.
type CompletionEvent struct {
	Runner    wire.RunnerId
	Session   wire.AgentSessionId
	Transport wire.TransportSessionId
	MessageID wire.MessageId
	Attempt   wire.JobAttemptId
	Lease     wire.LeaseId
	Job       wire.JobId
	Result    agentwire.ExecutionResultV1
	Ack       agentwire.CompletionAckKind
}

// PhaseEvent is an attempt phase reported by an agent.
type PhaseEvent struct {
	Runner  wire.RunnerId
	Attempt wire.JobAttemptId
	Lease   wire.LeaseId
	Phase   agentwire.AttemptPhase
}

// LeaseAnswerEvent is an agent's answer to a lease offer.
type LeaseAnswerEvent struct {
	Runner    wire.RunnerId
	Session   wire.AgentSessionId
	Lease     wire.LeaseId
	Attempt   wire.JobAttemptId
	Accepted  bool
	Reason    agentwire.LeaseRejectReason // when rejected
	Message   string
	Duplicate bool  // a repeated answer to an already answered offer
	Err       error // the authority refused to record it (stale lease, fenced)
}

// LeaseOffer is what OfferLease sends.
type LeaseOffer struct {
	Job     wire.JobId
	Attempt wire.JobAttemptId // zero → a new attempt id
	Spec    wire.JobSpecId
	Payload wire.CasObjectRef
	TTL     time.Duration // 0 → Timing.LeaseTTL
}

// Alike in shape to the other packages' sentinel-error blocks, but these are
// this package's own failures, each a stable API value: they stay apart.
// Errors returned by the host API.
var (
	// ErrNotConnected: the runner has no registered, active transport on
	// this daemon.
	ErrNotConnected = errors.New("daemon: runner not connected to this daemon")
	// ErrDraining: the runner (or the daemon) is draining; no new leases.
	ErrDraining = errors.New("daemon: runner draining")
	// ErrRoleForbidden: the runner's role does not take leases.
	ErrRoleForbidden = errors.New("daemon: peer role does not take leases")
	// ErrShutdown: the daemon is shutting down.
	ErrShutdown = errors.New("daemon: shut down")
	// ErrOfferExpired: the offer expired without an answer.
	ErrOfferExpired = errors.New("daemon: lease offer expired unanswered")
	// ErrLeaseRevoked: the lease was revoked before it was answered (the
	// agent session ended, the runner was disabled, an operator revoked
	// it); OfferLease's error wraps it with the revoke reason.
	ErrLeaseRevoked = errors.New("daemon: lease revoked unanswered")
)

// RejectedError is OfferLease's error when the agent rejected the offer.
type RejectedError struct {
	Reason  agentwire.LeaseRejectReason
	Message string
}

// Error names the agent's reason.
func (e *RejectedError) Error() string {
	return fmt.Sprintf("daemon: lease rejected by agent: %s: %s", e.Reason, e.Message)
}
