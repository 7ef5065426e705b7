package agent

import (
	"log/slog"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/enum"
	"forgeyard.dev/transport/wire/internal/maxsize"
	"forgeyard.dev/transport/wire/internal/seq"
	"forgeyard.dev/transport/wire/postcard"
)

// ActiveAttemptResyncV1 is one attempt the agent still runs, as reported in
// AgentResyncV1. Completion, when present, is the envelope MessageId of an
// AttemptCompletionV1 the agent sent but never saw acknowledged (§77), so
// the daemon can tell whether it already recorded it.
//
//	struct ActiveAttemptResyncV1 {
//	    attempt: [u8;16], lease: [u8;16],
//	    epoch: u64,                         // registration epoch the lease was granted under
//	    phase: AttemptPhase,
//	    log_seq: u64,                       // last log sequence number written
//	    completion: Option<[u8;16]>,
//	}
type ActiveAttemptResyncV1 struct {
	Attempt       wire.JobAttemptId
	Lease         wire.LeaseId
	Epoch         uint64
	Phase         AttemptPhase
	LogSeq        uint64
	HasCompletion bool
	Completion    wire.MessageId
}

const (
	activeAttemptResyncMinSize = maxsize.ID + maxsize.ID + 1 + 1 + 1 + 1
	activeAttemptResyncMaxSize = 2*maxsize.ID + maxsize.U64 + maxsize.Enum + maxsize.U64 + 1 + maxsize.ID
)

func (a *ActiveAttemptResyncV1) appendPostcard(b []byte) []byte {
	b = append(b, a.Attempt.ULID[:]...)
	b = append(b, a.Lease.ULID[:]...)
	b = postcard.AppendU64(b, a.Epoch)
	b = postcard.AppendVariant(b, uint32(a.Phase))
	b = postcard.AppendU64(b, a.LogSeq)
	b = postcard.AppendOption(b, a.HasCompletion)
	if a.HasCompletion {
		b = append(b, a.Completion.ULID[:]...)
	}
	return b
}

func (a *ActiveAttemptResyncV1) decodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &a.Attempt.ULID)
	wire.ReadULID(d, &a.Lease.ULID)
	a.Epoch = d.U64()
	a.Phase = AttemptPhase(d.Variant(numPhases))
	a.LogSeq = d.U64()
	a.HasCompletion = d.Option()
	a.Completion = wire.MessageId{}
	if a.HasCompletion {
		wire.ReadULID(d, &a.Completion.ULID)
	}
}

func (a *ActiveAttemptResyncV1) validate(msg string) error {
	if err := checkIDs(msg, idField{"active_attempts.attempt", a.Attempt.ULID},
		idField{"active_attempts.lease", a.Lease.ULID}); err != nil {
		return err
	}
	if a.Epoch == 0 {
		return invalid(msg, "active_attempts.epoch", "zero")
	}
	if !a.Phase.Valid() {
		return invalid(msg, "active_attempts.phase", "unknown phase")
	}
	return checkOptionID(msg, "active_attempts.completion", a.HasCompletion, a.Completion.ULID)
}

// AgentResyncV1 is sent after a reconnect (to the same or another daemon,
// §227–230) so the daemon can reconcile what the agent still runs with what
// it believes. Epoch is the registration epoch of the new registration;
// LastEventSeq is the last control event sequence number the agent
// processed.
//
//	struct AgentResyncV1 {
//	    session: [u8;16],
//	    epoch: u64,
//	    active_attempts: Vec<ActiveAttemptResyncV1>,   // ≤ MaxActiveAttempts (256)
//	    capability_digest: [u8;32],
//	    last_event_seq: u64,
//	}
//
// Validate: non-zero session, epoch and capability_digest; every attempt
// with non-zero ids and epoch, a known phase, a non-zero completion when
// present, and no attempt listed twice.
type AgentResyncV1 struct {
	Session          wire.AgentSessionId
	Epoch            uint64
	ActiveAttempts   []ActiveAttemptResyncV1
	CapabilityDigest wire.CapabilityDigest
	LastEventSeq     uint64
}

const nameAgentResync = "agent.AgentResyncV1"

var maxAgentResyncSize = maxsize.ID + maxsize.U64 + maxsize.Seq(MaxActiveAttempts, activeAttemptResyncMaxSize) +
	maxsize.Digest + maxsize.U64

// MessageType implements wire.Message.
func (*AgentResyncV1) MessageType() wire.MessageTypeId { return MsgAgentResync }

// AppendPostcard implements wire.Message.
func (m *AgentResyncV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Session.ULID[:]...)
	b = postcard.AppendU64(b, m.Epoch)
	b = seq.Append(b, m.ActiveAttempts, (*ActiveAttemptResyncV1).appendPostcard)
	b = append(b, m.CapabilityDigest.Digest[:]...)
	return postcard.AppendU64(b, m.LastEventSeq)
}

// DecodePostcard implements wire.Message. It reuses the capacity of
// m.ActiveAttempts.
func (m *AgentResyncV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Session.ULID)
	m.Epoch = d.U64()
	for a := range seq.Decode(d, &m.ActiveAttempts, MaxActiveAttempts, activeAttemptResyncMinSize) {
		a.decodePostcard(d)
	}
	wire.ReadDigest(d, &m.CapabilityDigest.Digest)
	m.LastEventSeq = d.U64()
}

// Validate implements wire.Message.
func (m *AgentResyncV1) Validate() error {
	const n = nameAgentResync
	if err := checkID(n, "session", m.Session.ULID); err != nil {
		return err
	}
	if m.Epoch == 0 {
		return invalid(n, "epoch", "zero")
	}
	if err := checkAttemptList(n, "active_attempts", m.ActiveAttempts, (*ActiveAttemptResyncV1).validate,
		func(a *ActiveAttemptResyncV1) wire.JobAttemptId { return a.Attempt }); err != nil {
		return err
	}
	if m.CapabilityDigest.IsZero() {
		return invalid(n, "capability_digest", "zero digest")
	}
	return nil
}

// ResyncDecisionKind is the discriminant of ResyncDecisionV1.
type ResyncDecisionKind uint32

// Resync decisions.
const (
	DecisionContinue ResyncDecisionKind = 0 // carries ExpiresAtMs and TTLMs: keep running
	DecisionCancel   ResyncDecisionKind = 1 // carries Reason: stop the attempt
	DecisionStale    ResyncDecisionKind = 2 // the lease is no longer this agent's: discard quietly

	numResyncDecisions = 3
)

// String returns the variant name, or "ResyncDecisionKind(n)" for a value this build
// does not define.
func (k ResyncDecisionKind) String() string {
	return enum.Name(resyncDecisionKindNames[:], k, "ResyncDecisionKind")
}

var resyncDecisionKindNames = [...]string{
	DecisionContinue: "Continue", DecisionCancel: "Cancel", DecisionStale: "Stale",
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (k ResyncDecisionKind) LogValue() slog.Value { return slog.StringValue(k.String()) }

// ResyncDecisionV1 is the daemon's decision on one resynced attempt, a
// Postcard enum with data:
//
//	enum ResyncDecision {
//	    Continue { expires_at_ms: u64, ttl_ms: u32 } = 0,
//	    Cancel { reason: CancellationReason } = 1,
//	    Stale = 2,
//	}
//
// Only the fields of Kind's variant are encoded; the others must be zero
// (Validate) and are zero after decoding.
type ResyncDecisionV1 struct {
	Kind        ResyncDecisionKind
	ExpiresAtMs uint64             // Continue: authoritative lease expiry, Unix ms
	TTLMs       uint32             // Continue: the same deadline as a local duration
	Reason      CancellationReason // Cancel
}

// The layout is RenewOutcomeV1's too (verdict.go).

func (r *ResyncDecisionV1) appendPostcard(b []byte) []byte {
	return appendVerdict(b, uint32(r.Kind), r.ExpiresAtMs, r.TTLMs, r.Reason)
}

func (r *ResyncDecisionV1) decodePostcard(d *postcard.Decoder) {
	k, expiresAtMs, ttlMs, reason := decodeVerdict(d)
	*r = ResyncDecisionV1{Kind: ResyncDecisionKind(k), ExpiresAtMs: expiresAtMs, TTLMs: ttlMs, Reason: reason}
}

func (r *ResyncDecisionV1) validate(msg string) error {
	return checkVerdict(msg, "results.decision", "Continue with zero expires_at_ms or ttl_ms",
		uint32(r.Kind), r.ExpiresAtMs, r.TTLMs, r.Reason)
}

// ResyncResultV1 is the decision for one attempt of an AgentResyncV1:
//
//	struct ResyncResultV1 { attempt: [u8;16], lease: [u8;16], decision: ResyncDecision }
type ResyncResultV1 struct {
	Attempt  wire.JobAttemptId
	Lease    wire.LeaseId
	Decision ResyncDecisionV1
}

const (
	resyncResultMinSize = 2*maxsize.ID + 1
	resyncResultMaxSize = 2*maxsize.ID + maxsize.Enum + maxsize.U64 + maxsize.U32
)

func (r *ResyncResultV1) appendPostcard(b []byte) []byte {
	b = append(b, r.Attempt.ULID[:]...)
	b = append(b, r.Lease.ULID[:]...)
	return r.Decision.appendPostcard(b)
}

func (r *ResyncResultV1) decodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &r.Attempt.ULID)
	wire.ReadULID(d, &r.Lease.ULID)
	r.Decision.decodePostcard(d)
}

func (r *ResyncResultV1) validate(msg string) error {
	if err := checkIDs(msg, idField{"results.attempt", r.Attempt.ULID},
		idField{"results.lease", r.Lease.ULID}); err != nil {
		return err
	}
	return r.Decision.validate(msg)
}

// ResyncResponseV1 answers AgentResyncV1 with one decision per attempt the
// agent listed. Attempts the daemon expects but the agent did not list are
// handled by the daemon (lease expiry), not here.
//
//	struct ResyncResponseV1 { results: Vec<ResyncResultV1> /* ≤ MaxActiveAttempts (256) */ }
//
// Validate: every result with non-zero ids and a valid decision, and no
// attempt listed twice.
type ResyncResponseV1 struct {
	Results []ResyncResultV1
}

const nameResyncResponse = "agent.ResyncResponseV1"

var maxResyncResponseSize = maxsize.Seq(MaxActiveAttempts, resyncResultMaxSize)

// MessageType implements wire.Message.
func (*ResyncResponseV1) MessageType() wire.MessageTypeId { return MsgResyncResponse }

// AppendPostcard implements wire.Message.
func (m *ResyncResponseV1) AppendPostcard(b []byte) []byte {
	return seq.Append(b, m.Results, (*ResyncResultV1).appendPostcard)
}

// DecodePostcard implements wire.Message. It reuses the capacity of
// m.Results.
func (m *ResyncResponseV1) DecodePostcard(d *postcard.Decoder) {
	for r := range seq.Decode(d, &m.Results, MaxActiveAttempts, resyncResultMinSize) {
		r.decodePostcard(d)
	}
}

// Validate implements wire.Message.
func (m *ResyncResponseV1) Validate() error {
	return checkAttemptList(nameResyncResponse, "results", m.Results, (*ResyncResultV1).validate,
		func(r *ResyncResultV1) wire.JobAttemptId { return r.Attempt })
}
