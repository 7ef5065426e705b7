// Package authority is the boundary between the transport and the run/job
// state machine and scheduler (ARCHITECTURE.md decision 12). The daemon
// consults an Authority for everything that must survive a daemon restart or
// be shared by several daemons (§227–230): runner status, agent-session
// epochs, leases, completions and the dedup records that make retried
// messages idempotent (§78–79).
//
// Two implementations pass one conformance suite (authoritytest): SQLite
// (OpenSQLite; the embedded default, one file) and PostgreSQL (OpenPostgres;
// shared by HA daemons). Both are the same SQL store over database/sql with
// a small dialect switch, so their behaviour cannot drift apart.
//
// Time: every method that depends on time takes `now` from the caller (the
// daemon's clock, §146); peer timestamps never reach this package. All
// methods are safe for concurrent use, including from several daemons
// sharing one PostgreSQL database.
package authority

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"forgeyard.dev/transport/wire"
)

// Alike in shape to the other packages' sentinel-error blocks, but these are
// this package's own failures, each a stable API value: they stay apart.

// Errors. Compare with errors.Is.
var (
	// ErrRunnerDisabled: the runner is disabled or revoked (§224–225).
	ErrRunnerDisabled = errors.New("authority: runner disabled")
	// ErrStaleSession: the agent session ended or was superseded by a newer
	// session of the same runner (§15, §179).
	ErrStaleSession = errors.New("authority: stale agent session")
	// ErrSessionOwnership: the agent session belongs to another runner.
	ErrSessionOwnership = errors.New("authority: agent session belongs to another runner")
	// ErrFenced: the caller's epoch is older than the session's current one
	// (§61–63).
	ErrFenced = errors.New("authority: transport fenced by a newer epoch")
	// ErrNotFound: no such lease, attempt or session.
	ErrNotFound = errors.New("authority: not found")
	// ErrStaleLease: the lease expired, was revoked, completed, or belongs to
	// another session (§144).
	ErrStaleLease = errors.New("authority: stale lease")
	// ErrConflict: an identifier is already used with different content.
	ErrConflict = errors.New("authority: conflicting record")
)

// ReasonLeaseExpired is the revoke reason Authority.ExpireLease records.
const ReasonLeaseExpired = "lease expired"

// LeaseState is the lifecycle state of a lease.
type LeaseState string

// Lease states.
const (
	LeaseOffered   LeaseState = "offered"
	LeaseAccepted  LeaseState = "accepted"
	LeaseRejected  LeaseState = "rejected"
	LeaseCompleted LeaseState = "completed"
	LeaseRevoked   LeaseState = "revoked"
)

// MaxSessionLeases bounds Authority.SessionLeases: a session with more
// matching leases gets the oldest MaxSessionLeases.
const MaxSessionLeases = 1024

// Valid reports whether s is one of the lease state constants.
func (s LeaseState) Valid() bool {
	switch s {
	case LeaseOffered, LeaseAccepted, LeaseRejected, LeaseCompleted, LeaseRevoked:
		return true
	}
	return false
}

// Live reports whether the lease still carries authority.
func (s LeaseState) Live() bool { return s == LeaseOffered || s == LeaseAccepted }

// Lease is the authority's record of one lease of one attempt.
type Lease struct {
	ID        wire.LeaseId
	Attempt   wire.JobAttemptId
	Job       wire.JobId
	Runner    wire.RunnerId
	Session   wire.AgentSessionId // the agent session the lease is bound to (§145)
	Spec      wire.JobSpecId
	Payload   wire.CasObjectRef
	TTL       time.Duration
	ExpiresAt time.Time
	State     LeaseState
	// CancelReason is set once a cancel was requested; 0 with Cancelled=false
	// otherwise. The value is the wire CancellationReason number.
	Cancelled    bool
	CancelReason uint32
	RevokeReason string
	CreatedAt    time.Time
}

// SessionGrant is the answer to a registration.
type SessionGrant struct {
	Epoch uint64 // monotonic per agent session; a newer epoch fences older transports
	// Previous is the transport this registration fenced, if any.
	Previous *SessionHolder
}

// SessionHolder names the transport holding an agent session.
type SessionHolder struct {
	Session   wire.AgentSessionId
	Runner    wire.RunnerId
	Epoch     uint64
	Transport wire.TransportSessionId
	Daemon    string // which daemon holds it (diagnostic, for the fenced side §61)
	Remote    string // remote address, diagnostic only (§205)
	Since     time.Time
}

// SessionRef names the caller's agent session and the epoch its transport
// was granted. State-changing operations fail with ErrFenced when a newer
// epoch exists (§61–63) and ErrStaleSession when the session ended. Epoch 0
// skips the epoch check (for host-side operations).
type SessionRef struct {
	Session wire.AgentSessionId
	Epoch   uint64
}

// Registration asks to (re)register an agent session on a new transport.
type Registration struct {
	Runner    wire.RunnerId
	Session   wire.AgentSessionId
	Transport wire.TransportSessionId
	Daemon    string
	Remote    string
	Now       time.Time
}

// Completion is a validated attempt completion (§75–77).
type Completion struct {
	MessageID wire.MessageId // stable across retries (§31, §77)
	Attempt   wire.JobAttemptId
	Lease     wire.LeaseId
	Session   SessionRef
	// Result is an opaque encoded result (the control layer stores the wire
	// ExecutionResultV1 encoding); the authority keeps it verbatim.
	Result  []byte
	Outputs []wire.CasObjectRef
	Now     time.Time
}

// AckKind is the authority's answer to a completion (§76).
type AckKind uint8

// Completion answers; numerically equal to wire CompletionAckKind.
const (
	AckAccepted          AckKind = 0
	AckDuplicateAccepted AckKind = 1
	AckStaleRejected     AckKind = 2
	AckInvalidRejected   AckKind = 3
)

var ackKindNames = [...]string{AckAccepted: "Accepted", AckDuplicateAccepted: "DuplicateAccepted",
	AckStaleRejected: "StaleRejected", AckInvalidRejected: "InvalidRejected"}

// String returns the kind's name (Accepted, DuplicateAccepted, …) for logs and metrics.
func (k AckKind) String() string { return kindName(ackKindNames[:], k, "AckKind?") }

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (k AckKind) LogValue() slog.Value { return slog.StringValue(k.String()) }

// RenewResult is the answer to a lease renewal (§70–71).
type RenewResult struct {
	Extended     bool
	ExpiresAt    time.Time // authoritative expiry when Extended
	Revoked      bool      // the lease lost authority; see CancelReason
	CancelReason uint32
	Unknown      bool // no such lease for this session
}

// AttemptClaim is one attempt an agent re-asserts after reconnect (§115).
type AttemptClaim struct {
	Attempt wire.JobAttemptId
	Lease   wire.LeaseId
}

// Decision is the authority's resync answer for one attempt (§117–120).
type Decision struct {
	Attempt      wire.JobAttemptId
	Lease        wire.LeaseId
	Kind         DecisionKind
	ExpiresAt    time.Time // for Continue
	CancelReason uint32    // for Cancel
}

// DecisionKind is Continue, Cancel or Stale; numerically equal to the wire
// ResyncDecision discriminant.
type DecisionKind uint8

// Resync decisions.
const (
	DecisionContinue DecisionKind = 0
	DecisionCancel   DecisionKind = 1
	DecisionStale    DecisionKind = 2
)

var decisionKindNames = [...]string{DecisionContinue: "Continue", DecisionCancel: "Cancel", DecisionStale: "Stale"}

// String returns the decision's name (Continue, Cancel, Stale).
func (k DecisionKind) String() string { return kindName(decisionKindNames[:], k, "DecisionKind?") }

// kindName is the String of AckKind and DecisionKind: names[k], or unknown
// for a value without a name.
func kindName[K ~uint8](names []string, k K, unknown string) string {
	if int(k) < len(names) {
		return names[k]
	}
	return unknown
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (k DecisionKind) LogValue() slog.Value { return slog.StringValue(k.String()) }

// RunnerStatus is what the authority knows of a runner.
type RunnerStatus struct {
	Runner   wire.RunnerId
	Enabled  bool
	Reason   string
	Changed  time.Time
	Sessions int // live agent sessions
}

// SweepElector is implemented by the SQL stores. Several daemons sharing one
// PostgreSQL database elect one of them to sweep expired leases, so two
// daemons do not both list and expire the same leases: the daemon whose
// handle holds the database's sweep lock (a session-level advisory lock on
// one connection) is the leader until that connection ends (the daemon
// stops or dies, or the connection breaks), and then the next daemon to ask
// takes over. The embedded SQLite store has one daemon: it always leads.
// ExpireLease stays safe without the election (it re-judges under the row
// lock); the election avoids the duplicated work and the race.
type SweepElector interface {
	// SweepLeader reports whether this handle is the sweep leader,
	// acquiring the lock if it is free.
	SweepLeader(ctx context.Context) (bool, error)
}

// EventKind names what an Event reports.
type EventKind uint8

// Event kinds.
const (
	// EventCancel: CancelAttempt recorded a cancel (Reason is the wire
	// CancellationReason).
	EventCancel EventKind = 1
	// EventRevoke: RevokeLease or ExpireLease took a live lease's authority.
	EventRevoke EventKind = 2
	// EventRunner: Runner's state changed; Reason says how (the
	// RunnerEvent constants). A disable or a revoked certificate
	// (RunnerEventDisabled, RunnerEventCheck) makes every daemon re-check
	// that runner's transports at once instead of at its next revocation
	// poll, and is also delivered to the handle that made the change; a
	// drain or a resume is sent to the agent by the daemons holding its
	// transports instead of at its next renewal or reconnect.
	EventRunner EventKind = 3
)

// Reasons of an EventRunner.
const (
	RunnerEventCheck    uint32 = 0 // a certificate of the runner was revoked: re-check its transports
	RunnerEventDisabled uint32 = 1
	RunnerEventEnabled  uint32 = 2
	RunnerEventDrained  uint32 = 3
	RunnerEventResumed  uint32 = 4
)

// Event is a change another daemon made that the daemon holding the
// lease's session must deliver to its agent at once.
type Event struct {
	Kind    EventKind
	Lease   wire.LeaseId
	Attempt wire.JobAttemptId
	Session wire.AgentSessionId
	Reason  uint32        // for EventCancel and EventRunner
	Runner  wire.RunnerId // for EventRunner
}

// Watcher is implemented by the SQL stores. On PostgreSQL, Watch delivers
// the cancels and revocations committed through OTHER handles of the same
// database (other daemons), by LISTEN/NOTIFY: each is sent in the
// transaction that records it, so it arrives only once committed, within
// milliseconds. Delivery is best effort: events committed while the
// listening connection is down (it reconnects, with backoff, also when the
// database is unreachable when Watch is called: Watch then still returns
// the channel, which delivers once the database answers) or while the
// channel is full are not repeated; the agent then learns at its next
// renewal, as without events. The channel closes when ctx ends. The embedded SQLite store has a
// single daemon and returns a nil channel.
type Watcher interface {
	Watch(ctx context.Context) (<-chan Event, error)
}

// Authority is the daemon's view of durable transport state.
type Authority interface {
	// RunnerStatus returns the runner's status; an unknown runner is enabled.
	RunnerStatus(ctx context.Context, runner wire.RunnerId) (RunnerStatus, error)
	// SetRunnerEnabled enables or disables (revokes) a runner. Disabling ends
	// its sessions and revokes its live leases.
	SetRunnerEnabled(ctx context.Context, runner wire.RunnerId, enabled bool, reason string, now time.Time) error

	// RegisterSession (re)registers an agent session on a new transport and
	// returns the next epoch. A first registration of a session supersedes the
	// runner's other sessions (their leases go stale, §15). Errors:
	// ErrRunnerDisabled, ErrStaleSession, ErrSessionOwnership.
	RegisterSession(ctx context.Context, r Registration) (SessionGrant, error)
	// CheckEpoch returns nil while epoch is the session's current epoch,
	// ErrFenced (with the holder) when a newer epoch exists, ErrStaleSession
	// when the session ended.
	CheckEpoch(ctx context.Context, session wire.AgentSessionId, epoch uint64) (SessionHolder, error)
	// EndSession ends an agent session (graceful agent exit); its live leases
	// are revoked.
	EndSession(ctx context.Context, session wire.AgentSessionId, now time.Time) error

	// CreateLease records a lease offered to a session. Creating the same
	// lease again with the same content is a no-op (duplicate offers are
	// safe, §67); different content is ErrConflict.
	CreateLease(ctx context.Context, l Lease) error
	// Lease returns one lease.
	Lease(ctx context.Context, id wire.LeaseId) (Lease, error)
	// AcceptLease marks a lease accepted by its session (idempotent).
	// ErrStaleLease if it is not live or bound to another session.
	AcceptLease(ctx context.Context, id wire.LeaseId, attempt wire.JobAttemptId, session SessionRef, now time.Time) (Lease, error)
	// RejectLease records the agent's rejection (idempotent).
	RejectLease(ctx context.Context, id wire.LeaseId, attempt wire.JobAttemptId, session SessionRef, now time.Time) error
	// RenewLease extends a live lease to now+TTL (never shortening it).
	// Renewals are idempotent: the same MessageId gets the same answer.
	RenewLease(ctx context.Context, msg wire.MessageId, id wire.LeaseId, attempt wire.JobAttemptId, session SessionRef, now time.Time) (RenewResult, error)
	// CancelAttempt requests cancellation of the attempt's live lease
	// (idempotent). It returns the lease so the daemon can deliver the cancel.
	CancelAttempt(ctx context.Context, attempt wire.JobAttemptId, reason uint32, now time.Time) (Lease, error)
	// CompleteAttempt records a completion exactly once per attempt. The same
	// MessageId again answers AckDuplicateAccepted; a completion for a lease
	// that is no longer live, or from another session, answers
	// AckStaleRejected. A fenced transport gets ErrFenced (it must retry on
	// its current transport, where the same MessageId is answered normally).
	CompleteAttempt(ctx context.Context, c Completion) (AckKind, error)
	// Resync answers Continue/Cancel/Stale for each claimed attempt of a
	// session (§115–121). Repeating it is harmless.
	Resync(ctx context.Context, session SessionRef, claims []AttemptClaim, now time.Time) ([]Decision, error)
	// SessionLeases lists the leases bound to session, oldest first (by
	// creation time, then lease id), at most MaxSessionLeases of them. With
	// states it lists only leases in one of those states; with none, all.
	// An unknown session has no leases (nil, nil). A state other than the
	// five LeaseState constants is an error. Daemons use it to re-send
	// offers created elsewhere after the agent reconnects (§67, §229).
	SessionLeases(ctx context.Context, session wire.AgentSessionId, states ...LeaseState) ([]Lease, error)
	// ExpiredLeases lists live leases whose expiry is before `before`.
	ExpiredLeases(ctx context.Context, before time.Time, limit int) ([]Lease, error)
	// RevokeLease revokes a live lease unconditionally (operator action).
	RevokeLease(ctx context.Context, id wire.LeaseId, reason string, now time.Time) error
	// ExpireLease revokes the lease (reason ReasonLeaseExpired) only if it is
	// still live and its expiry is still before `before` (the sweep's now
	// minus its grace), judged in one transaction under the lease's row lock,
	// so a renewal committed after ExpiredLeases listed the lease (by any
	// daemon sharing the store) wins over the sweep. It reports whether this
	// call revoked the lease: false if the lease was renewed, is no longer
	// live, or was already expired by another sweep. An unknown lease is
	// ErrNotFound.
	ExpireLease(ctx context.Context, id wire.LeaseId, before time.Time) (expired bool, err error)
	// Completions counts recorded completions of an attempt (0 or 1); for
	// tests and audits.
	Completions(ctx context.Context, attempt wire.JobAttemptId) (int, error)
	// PruneDedup deletes dedup records older than before and returns how
	// many it removed (§79).
	PruneDedup(ctx context.Context, before time.Time) (int, error)

	Close() error
}
