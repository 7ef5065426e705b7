package agent

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/health"
)

// Endpoint is one daemon address and the backend dialer that reaches it.
//
// Class places it in the fallback race (fallback.go); ClassAuto derives it
// from Backend. Relay endpoints must say ClassRelay.
type Endpoint struct {
	Address string
	Dialer  semantics.BackendDialer
	Backend string // name for status and logs ("quic", "yamux", "memory", …)
	Class   Class
}

// Backoff is the reconnect policy: exponential with FULL jitter (§104,
// §219): the n-th wait is uniform in [0, min(Max, Base·2ⁿ)]. The daemon's
// max_backoff (RegistrationAcceptedV1) replaces Max once known.
//
// Authentication failures on the path are different: a proxy that
// answers 407 to wrong credentials refuses every retry the same way, and
// each retry is a failed login at the directory behind it (enough of them
// lock the account). A connect round in which an endpoint failed with such
// an error (one with an AuthFailure() bool method that returns true, e.g.
// backends/yamux/proxy's *AuthRequiredError) and none registered counts as
// an authentication round; after AuthAfter consecutive ones the k-th
// further wait is uniform in [d/2, d] with d = min(AuthMax,
// DefaultAuthBackoffBase·2^(k-1)) — 30–60 s, 1–2 min, … up to 30–60 min
// with the defaults: at most 10 logins in the first hour and one or two an
// hour after, instead of one per Max (120 an hour). A round without one, or a registration,
// ends the run. AuthSchedule lists the ceilings.
type Backoff struct {
	Base time.Duration // 0 → DefaultBackoffBase
	Max  time.Duration // 0 → DefaultBackoffMax
	// AuthAfter is how many consecutive authentication rounds are retried
	// on the ordinary schedule (a typo fixed in the file is picked up at
	// once); 0 → DefaultAuthBackoffAfter (3).
	AuthAfter int
	// AuthMax is the ceiling of the authentication backoff; 0 →
	// DefaultAuthBackoffMax (1 h); negative turns it off (authentication
	// failures back off like any other failure).
	AuthMax time.Duration
}

// Defaults.
const (
	DefaultBackoffBase = 200 * time.Millisecond
	DefaultBackoffMax  = 30 * time.Second
	// DefaultAuthBackoffAfter, DefaultAuthBackoffBase and
	// DefaultAuthBackoffMax shape the backoff after repeated
	// authentication failures on the path (Backoff).
	DefaultAuthBackoffAfter = 3
	DefaultAuthBackoffBase  = time.Minute
	DefaultAuthBackoffMax   = time.Hour
	DefaultRequestTimeout   = 10 * time.Second
	DefaultMaxParallel      = 1
	// answerRetention bounds the remembered offer answers (duplicate offers
	// are answered from it): per answer a lease id in a ring and a map slot
	// (lease id and OfferEvent), ~100 B; ~400 KiB when full.
	answerRetention = 4096
)

// Hooks observe the agent; they are called from agent goroutines and must
// not block for long. Nil hooks are skipped.
type Hooks struct {
	// OnConnected: a transport registered and resynced.
	OnConnected func(Status)
	// OnDisconnected: the current transport ended (err says why).
	OnDisconnected func(error)
	// OnOffer: an offer was answered; Duplicate for a repeated offer.
	OnOffer func(OfferEvent)
	// OnAttemptStarted: the executor was started for an accepted lease.
	OnAttemptStarted func(Job)
	// OnCancel: an attempt's executor context was cancelled.
	OnCancel func(attempt wire.JobAttemptId, reason agentwire.CancellationReason)
	// OnAttemptDone: the daemon acknowledged an attempt's completion.
	OnAttemptDone func(AttemptDone)
	// OnCertificateRenewed: a renewed certificate was stored (enroll.go);
	// the agent reconnects with it next.
	OnCertificateRenewed func(*x509.Certificate)
	// OnBackendChange: the agent registered over a different backend than
	// before (a fallback, or a move back after probing); reason is the new
	// Status.FallbackReason.
	OnBackendChange func(change BackendChange, reason string)
}

// OfferEvent describes the answer to a lease offer.
type OfferEvent struct {
	Lease     wire.LeaseId
	Attempt   wire.JobAttemptId
	Accepted  bool
	Reason    agentwire.LeaseRejectReason
	Duplicate bool
}

// AttemptDone is an acknowledged completion.
type AttemptDone struct {
	Job     Job
	Result  Result
	Ack     agentwire.CompletionAckKind
	Retries int // completion re-sends before the ack
}

// Config configures an Agent. New copies it.
type Config struct {
	Runner    wire.RunnerId // required; must match the certificate
	Signer    crypto.Signer // the certificate's private key (key proof); required
	CertChain [][]byte      // DER, leaf first; sent in RegisterAgentV1
	// Credentials, when set, replaces Signer and CertChain: every
	// registration uses its current key and chain, and the agent renews
	// the certificate over its session before it expires (enroll.go),
	// storing it with Credentials.Update and reconnecting with it. The
	// dialers' TLS configurations must present the same credentials
	// (trust.Credentials.ClientConfigFor).
	Credentials *trust.Credentials
	// RenewWindow: renew at 2/3 of the certificate's lifetime or this long
	// before expiry, whichever is first; 0 → trust.DefaultExpiryWarningWindow.
	RenewWindow time.Duration
	Endpoints   []Endpoint // tried in order (failover); at least one
	Protocol    wire.ProtocolRange
	Features    wire.FeatureSet
	Role        agentwire.PeerRole
	// Capabilities; zero OS/Arch/MaxParallel are filled from the runtime
	// and MaxParallel.
	Capabilities agentwire.RunnerCapabilitiesV1
	Executor     Executor // required for RoleAgent
	// Service serves the requests of a role that runs no attempts
	// (RoleSigningWorker, RoleDeviceAgent; service.go); required for
	// those roles' requests to be answered, refused for the others.
	Service     Service
	MaxParallel int // concurrent attempts; 0 → 1
	Backoff     Backoff
	// FallbackStagger staggers endpoints of the same Class (a failover
	// list, e.g. two daemons over QUIC): the i-th fallback within a class
	// starts FallbackStagger[i-1] (the last entry repeats) after the
	// previous one started. Empty means sequential failover within a class
	// (the next starts when the previous failed). Classes themselves are
	// staggered by Fallback.ClassStagger.
	FallbackStagger []time.Duration
	// Fallback tunes the backend race, the per-network memory of the last
	// good endpoint and the move back to a better backend (fallback.go).
	Fallback Fallback
	// RequestTimeout is the deadline of each request (hello, register,
	// resync, renew, completion); 0 → DefaultRequestTimeout.
	RequestTimeout time.Duration
	// HeartbeatMisses: the agent treats its link as dead and reconnects
	// (same session, backoff and fallback as after any cut; OnDisconnected
	// gets ErrHeartbeatTimeout) when no heartbeat was acknowledged for this
	// many heartbeat intervals (the daemon's interval), counted from the
	// last ack of any heartbeat or from the registration, so late acks
	// inside the window keep the link. 0 → DefaultHeartbeatMisses (3);
	// negative turns the rule off (the transport's idle timeout decides).
	HeartbeatMisses int
	// LeaseGrace: an attempt whose lease passed its expiry on the daemon's
	// clock by this much without a renewal is stopped when the agent has no
	// link to the daemon, and renewed at once when it has one (clock.go);
	// 0 → DefaultLeaseGrace (1 s).
	LeaseGrace time.Duration
	// HealthChecks, when set, adds the host's own checks to every health
	// probe the daemon asks for (health.go); they must return quickly
	// and carry no secrets.
	HealthChecks func(ctx context.Context, probe health.ProbeKind) []health.HealthCheckV1
	Logger       *slog.Logger
	// Now is the agent's wall clock (tests inject a skewed one); nil means
	// time.Now. Daemon deadlines are judged on it plus the daemon's clock
	// offset (clock.go).
	Now     func() time.Time
	Version string // agent version reported to the daemon
	Limits  semantics.Limits
	Hooks   Hooks
	// SpoolDir is the root of the agent's on-disk state: SpoolDir/<agent
	// session>/logs holds the attempts' log spools and …/cas the outputs
	// executors store with Output.PutOutput until they are uploaded. Empty
	// means os.TempDir()/forgeyard-spool. The session directory is removed
	// by Close (a new Agent is a new session and inherits nothing).
	SpoolDir string
	// LogSpoolLimit bounds each attempt's pending (unacknowledged) log
	// bytes; writes over it are dropped and counted. 0 means
	// logs.DefaultSpoolLimit.
	LogSpoolLimit int64
	// FetchPayload makes the agent download each lease's payload (the
	// LeaseOfferV1 payload_ref) from the daemon's CAS into its local store
	// before the executor starts — verified against its digest, resumed
	// from the kept prefix after a reconnect — so the executor can read it
	// with Job.OpenPayload. An attempt whose payload cannot be fetched ends
	// InfraError without running. False leaves the payload to the executor.
	FetchPayload bool
	// Metrics, when set, is fed by the agent's connections (bytes, streams,
	// queue depths, messages, protocol errors), its heartbeat round trips
	// (forgeyard_heartbeat_rtt_seconds), its backend changes
	// (forgeyard_transport_fallback_events_total), its log writers and its
	// CAS uploader and downloader. Nil disables them.
	Metrics *telemetry.Metrics
	// Tracing starts the agent's spans (§210): transport.handshake,
	// agent.register,
	// reconnect.resync, lease.ack (offer received → answer sent) and
	// attempt.complete. When FeatureTraceContextV1 was negotiated (add it
	// to Features) they continue the daemon's trace from the envelope and
	// the answer and completion envelopes carry the agent's span context
	// back. Nil starts no spans (trace context still propagates).
	Tracing *telemetry.Tracing
}

func (c *Config) check() error {
	switch {
	case c.Runner == (wire.RunnerId{}):
		return errors.New("agent: Config.Runner is required")
	case c.Signer == nil && c.Credentials == nil:
		return errors.New("agent: Config.Signer (or Credentials) is required (key proof)")
	case len(c.Endpoints) == 0:
		return errors.New("agent: Config.Endpoints is empty")
	case !c.Role.Valid():
		return fmt.Errorf("agent: Config.Role %v unknown", c.Role)
	case (c.Role == agentwire.RoleAgent || c.Role == agentwire.RoleInternalWorker) && c.Executor == nil:
		return errors.New("agent: Config.Executor is required for this role")
	case c.Backoff.AuthAfter < 0 || c.Backoff.AuthAfter > 1000:
		return fmt.Errorf("agent: Config.Backoff.AuthAfter %d out of range (0–1000)", c.Backoff.AuthAfter)
	case (c.Role == agentwire.RoleAgent || c.Role == agentwire.RoleInternalWorker) && c.Service != nil:
		return errors.New("agent: Config.Service is for roles that run no attempts (signing worker, device agent)")
	case c.HeartbeatMisses > 1000:
		return fmt.Errorf("agent: Config.HeartbeatMisses %d out of range (at most 1000)", c.HeartbeatMisses)
	case c.MaxParallel < 0 || c.MaxParallel > 0xffff:
		return fmt.Errorf("agent: Config.MaxParallel %d out of range", c.MaxParallel)
	case len(c.CertChain) > agentwire.MaxCertChain:
		return fmt.Errorf("agent: Config.CertChain has %d certificates (max %d)", len(c.CertChain), agentwire.MaxCertChain)
	}
	for i, e := range c.Endpoints {
		if e.Dialer == nil || e.Address == "" {
			return fmt.Errorf("agent: Config.Endpoints[%d] needs Address and Dialer", i)
		}
	}
	return c.Limits.Validate()
}

// VersionError is Run's error when the daemon shares no protocol version
// with the agent (or the agent is below the daemon's policy minimum).
// Message is the daemon's text naming both ranges, e.g. "no common protocol
// version: server supports 3.0–4.2, agent supports 1.0–2.1".
type VersionError struct {
	Message     string
	ServerRange wire.ProtocolRange
	Endpoint    string
}

// Error returns the daemon's message verbatim (it names both ranges).
func (e *VersionError) Error() string { return e.Message }

// RejectedError is a registration the daemon refused (authentication,
// disabled runner, stale session). Run returns it when Retry says not to
// retry (RetryNever, RetryUnsupported).
type RejectedError struct {
	Code     wire.ProtocolErrorCode
	Retry    wire.RetryClass
	Message  string
	Endpoint string
	// RetryAfter is the daemon's structured retry hint
	// (agentwire.RegistrationDeferredV1, feature RetryAfterV1): the agent
	// does not reconnect before it has passed (plus its own jitter). 0:
	// none (the agent's own backoff applies).
	RetryAfter time.Duration
}

// Error names the endpoint, code, retry class and the daemon's message.
func (e *RejectedError) Error() string {
	return fmt.Sprintf("agent: registration rejected by %s: %s (retry %s): %s", e.Endpoint, e.Code, e.Retry, e.Message)
}

func (e *RejectedError) permanent() bool {
	return e.Retry == wire.RetryNever || e.Retry == wire.RetryUnsupported
}
