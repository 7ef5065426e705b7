package agent

import (
	"log/slog"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/enum"
	"forgeyard.dev/transport/wire/internal/maxsize"
	"forgeyard.dev/transport/wire/postcard"
)

// LeaseOfferV1 offers one attempt of a job to the agent (§64–67). Delivery is
// at least once: a duplicate offer (same lease and attempt) is safe and is
// answered like the first. The spec itself travels through CAS (PayloadRef);
// the agent verifies its digest equals SpecID before running it (§66). The
// offer is bound to the agent session and registration epoch it was made
// for (§145); the agent rejects one for another session or epoch.
//
//	struct LeaseOfferV1 {
//	    lease: [u8;16], attempt: [u8;16], job: [u8;16],
//	    spec_id: [u8;32],
//	    expires_at_ms: u64,                 // authoritative expiry, Unix ms
//	    ttl_ms: u32,                        // the same deadline as a local duration (§148)
//	    payload_ref: CasObjectRef,          // {algorithm: enum, digest: [u8;32], size: u64}
//	    session: [u8;16],
//	    epoch: u64,
//	}
//
// Validate: non-zero ids, spec_id, expires_at_ms, ttl_ms and epoch; a
// payload_ref with a known algorithm and non-zero digest.
type LeaseOfferV1 struct {
	Lease       wire.LeaseId
	Attempt     wire.JobAttemptId
	Job         wire.JobId
	SpecID      wire.JobSpecId
	ExpiresAtMs uint64
	TTLMs       uint32
	PayloadRef  wire.CasObjectRef
	Session     wire.AgentSessionId
	Epoch       uint64
}

const nameLeaseOffer = "agent.LeaseOfferV1"

var maxLeaseOfferSize = 3*maxsize.ID + maxsize.Digest + maxsize.U64 + maxsize.U32 + maxsize.Ref +
	maxsize.ID + maxsize.U64

// MessageType implements wire.Message.
func (*LeaseOfferV1) MessageType() wire.MessageTypeId { return MsgLeaseOffer }

// AppendPostcard implements wire.Message.
func (m *LeaseOfferV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Lease.ULID[:]...)
	b = append(b, m.Attempt.ULID[:]...)
	b = append(b, m.Job.ULID[:]...)
	b = append(b, m.SpecID.Digest[:]...)
	b = postcard.AppendU64(b, m.ExpiresAtMs)
	b = postcard.AppendU32(b, m.TTLMs)
	b = m.PayloadRef.AppendPostcard(b)
	b = append(b, m.Session.ULID[:]...)
	return postcard.AppendU64(b, m.Epoch)
}

// DecodePostcard implements wire.Message.
func (m *LeaseOfferV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Lease.ULID)
	wire.ReadULID(d, &m.Attempt.ULID)
	wire.ReadULID(d, &m.Job.ULID)
	wire.ReadDigest(d, &m.SpecID.Digest)
	m.ExpiresAtMs = d.U64()
	m.TTLMs = d.U32()
	m.PayloadRef.DecodePostcard(d)
	wire.ReadULID(d, &m.Session.ULID)
	m.Epoch = d.U64()
}

// Validate implements wire.Message.
func (m *LeaseOfferV1) Validate() error {
	const n = nameLeaseOffer
	if err := checkIDs(n, idField{"lease", m.Lease.ULID}, idField{"attempt", m.Attempt.ULID},
		idField{"job", m.Job.ULID}, idField{"session", m.Session.ULID}); err != nil {
		return err
	}
	if m.SpecID.IsZero() {
		return invalid(n, "spec_id", "zero digest")
	}
	if err := checkNonZero(n, numField{"expires_at_ms", m.ExpiresAtMs}, numField{"ttl_ms", uint64(m.TTLMs)},
		numField{"epoch", m.Epoch}); err != nil {
		return err
	}
	return checkCas(n, "payload_ref", &m.PayloadRef)
}

// LeaseAcceptedV1 accepts a lease offer (§68). It is idempotent: the agent
// sends it again for a duplicate offer.
//
//	struct LeaseAcceptedV1 { lease: [u8;16], attempt: [u8;16], session: [u8;16] }
//
// Validate: non-zero ids.
type LeaseAcceptedV1 struct {
	Lease   wire.LeaseId
	Attempt wire.JobAttemptId
	Session wire.AgentSessionId
}

const nameLeaseAccepted = "agent.LeaseAcceptedV1"

var maxLeaseAcceptedSize = 3 * maxsize.ID

// MessageType implements wire.Message.
func (*LeaseAcceptedV1) MessageType() wire.MessageTypeId { return MsgLeaseAccepted }

// AppendPostcard implements wire.Message.
func (m *LeaseAcceptedV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Lease.ULID[:]...)
	b = append(b, m.Attempt.ULID[:]...)
	return append(b, m.Session.ULID[:]...)
}

// DecodePostcard implements wire.Message.
func (m *LeaseAcceptedV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Lease.ULID)
	wire.ReadULID(d, &m.Attempt.ULID)
	wire.ReadULID(d, &m.Session.ULID)
}

// Validate implements wire.Message.
func (m *LeaseAcceptedV1) Validate() error {
	return checkIDs(nameLeaseAccepted, idField{"lease", m.Lease.ULID},
		idField{"attempt", m.Attempt.ULID}, idField{"session", m.Session.ULID})
}

// LeaseRejectedV1 refuses a lease offer with a typed reason (§69).
//
//	struct LeaseRejectedV1 {
//	    lease: [u8;16], attempt: [u8;16],
//	    reason: LeaseRejectReason,
//	    message: String,                    // ≤ MaxMessage (256) bytes, truncated on encode
//	}
//
// Validate: non-zero ids, known reason, UTF-8 message.
type LeaseRejectedV1 struct {
	Lease   wire.LeaseId
	Attempt wire.JobAttemptId
	Reason  LeaseRejectReason
	Message string
}

const nameLeaseRejected = "agent.LeaseRejectedV1"

// MessageType implements wire.Message.
func (*LeaseRejectedV1) MessageType() wire.MessageTypeId { return MsgLeaseRejected }

// AppendPostcard implements wire.Message (the note layout, note.go).
func (m *LeaseRejectedV1) AppendPostcard(b []byte) []byte {
	return appendNote(b, &m.Lease.ULID, &m.Attempt.ULID, uint32(m.Reason), m.Message)
}

// DecodePostcard implements wire.Message.
func (m *LeaseRejectedV1) DecodePostcard(d *postcard.Decoder) {
	m.Reason = LeaseRejectReason(decodeNote(d, &m.Lease.ULID, &m.Attempt.ULID, numLeaseRejectReasons, &m.Message))
}

// Validate implements wire.Message.
func (m *LeaseRejectedV1) Validate() error {
	return checkNote(nameLeaseRejected, idField{"lease", m.Lease.ULID}, idField{"attempt", m.Attempt.ULID},
		"reason", m.Reason.Valid(), m.Message)
}

// LeaseRenewV1 asks the daemon to extend a lease (§70) and reports the phase
// the agent observes. The daemon extends it only while still authoritative.
//
//	struct LeaseRenewV1 { lease: [u8;16], attempt: [u8;16], observed_phase: AttemptPhase }
//
// Validate: non-zero ids, known phase.
type LeaseRenewV1 struct {
	Lease         wire.LeaseId
	Attempt       wire.JobAttemptId
	ObservedPhase AttemptPhase
}

const nameLeaseRenew = "agent.LeaseRenewV1"

var maxLeaseRenewSize = 2*maxsize.ID + maxsize.Enum

// MessageType implements wire.Message.
func (*LeaseRenewV1) MessageType() wire.MessageTypeId { return MsgLeaseRenew }

// AppendPostcard implements wire.Message.
func (m *LeaseRenewV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Lease.ULID[:]...)
	b = append(b, m.Attempt.ULID[:]...)
	return postcard.AppendVariant(b, uint32(m.ObservedPhase))
}

// DecodePostcard implements wire.Message.
func (m *LeaseRenewV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Lease.ULID)
	wire.ReadULID(d, &m.Attempt.ULID)
	m.ObservedPhase = AttemptPhase(d.Variant(numPhases))
}

// Validate implements wire.Message.
func (m *LeaseRenewV1) Validate() error {
	if err := checkIDs(nameLeaseRenew, idField{"lease", m.Lease.ULID}, idField{"attempt", m.Attempt.ULID}); err != nil {
		return err
	}
	if !m.ObservedPhase.Valid() {
		return invalid(nameLeaseRenew, "observed_phase", "unknown phase")
	}
	return nil
}

// RenewOutcomeKind is the discriminant of RenewOutcomeV1.
type RenewOutcomeKind uint32

// Renew outcomes.
const (
	RenewExtended RenewOutcomeKind = 0 // carries ExpiresAtMs and TTLMs
	RenewRevoked  RenewOutcomeKind = 1 // carries Reason; the agent stops the attempt
	RenewUnknown  RenewOutcomeKind = 2 // the daemon does not know the lease: resync

	numRenewOutcomes = 3
)

// String returns the variant name, or "RenewOutcomeKind(n)" for a value this build
// does not define.
func (k RenewOutcomeKind) String() string {
	return enum.Name(renewOutcomeKindNames[:], k, "RenewOutcomeKind")
}

var renewOutcomeKindNames = [...]string{
	RenewExtended: "Extended", RenewRevoked: "Revoked", RenewUnknown: "Unknown",
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (k RenewOutcomeKind) LogValue() slog.Value { return slog.StringValue(k.String()) }

// RenewOutcomeV1 is the daemon's answer to a renewal (§71), a Postcard enum
// with data:
//
//	enum RenewOutcome {
//	    Extended { expires_at_ms: u64, ttl_ms: u32 } = 0,
//	    Revoked { reason: CancellationReason } = 1,
//	    Unknown = 2,
//	}
//
// Only the fields of Kind's variant are encoded; the others must be zero
// (Validate) and are zero after decoding.
type RenewOutcomeV1 struct {
	Kind        RenewOutcomeKind
	ExpiresAtMs uint64             // Extended: new authoritative expiry, Unix ms
	TTLMs       uint32             // Extended: the same deadline as a local duration
	Reason      CancellationReason // Revoked
}

const maxRenewOutcomeSize = maxsize.Enum + maxsize.U64 + maxsize.U32

// The layout is ResyncDecisionV1's too (verdict.go); the kind and its type
// are alike in shape to ResyncDecisionKind's, but they are another enum of
// the API, with other names.

func (o *RenewOutcomeV1) appendPostcard(b []byte) []byte {
	return appendVerdict(b, uint32(o.Kind), o.ExpiresAtMs, o.TTLMs, o.Reason)
}

func (o *RenewOutcomeV1) decodePostcard(d *postcard.Decoder) {
	k, expiresAtMs, ttlMs, reason := decodeVerdict(d)
	*o = RenewOutcomeV1{Kind: RenewOutcomeKind(k), ExpiresAtMs: expiresAtMs, TTLMs: ttlMs, Reason: reason}
}

func (o *RenewOutcomeV1) validate(msg string) error {
	return checkVerdict(msg, "outcome", "Extended with zero expires_at_ms or ttl_ms",
		uint32(o.Kind), o.ExpiresAtMs, o.TTLMs, o.Reason)
}

// LeaseRenewAckV1 answers a LeaseRenewV1 (§71).
//
//	struct LeaseRenewAckV1 { lease: [u8;16], attempt: [u8;16], outcome: RenewOutcome }
//
// Validate: non-zero ids and a valid outcome.
type LeaseRenewAckV1 struct {
	Lease   wire.LeaseId
	Attempt wire.JobAttemptId
	Outcome RenewOutcomeV1
}

const nameLeaseRenewAck = "agent.LeaseRenewAckV1"

var maxLeaseRenewAckSize = 2*maxsize.ID + maxRenewOutcomeSize

// MessageType implements wire.Message.
func (*LeaseRenewAckV1) MessageType() wire.MessageTypeId { return MsgLeaseRenewAck }

// AppendPostcard implements wire.Message.
func (m *LeaseRenewAckV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Lease.ULID[:]...)
	b = append(b, m.Attempt.ULID[:]...)
	return m.Outcome.appendPostcard(b)
}

// DecodePostcard implements wire.Message.
func (m *LeaseRenewAckV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Lease.ULID)
	wire.ReadULID(d, &m.Attempt.ULID)
	m.Outcome.decodePostcard(d)
}

// Validate implements wire.Message.
func (m *LeaseRenewAckV1) Validate() error {
	if err := checkIDs(nameLeaseRenewAck, idField{"lease", m.Lease.ULID}, idField{"attempt", m.Attempt.ULID}); err != nil {
		return err
	}
	return m.Outcome.validate(nameLeaseRenewAck)
}

// LeaseProbeV1 asks the agent whether it still runs an attempt under a lease
// whose holder went quiet, before the daemon reassigns it. The agent answers
// with LeaseRenewV1 (still running) or AttemptCompletionV1 before
// GraceUntilMs; after it, the daemon treats the lease as expired.
//
//	struct LeaseProbeV1 { lease: [u8;16], attempt: [u8;16], grace_until_ms: u64 /* Unix ms */ }
//
// Validate: non-zero ids and grace_until_ms.
type LeaseProbeV1 struct {
	Lease        wire.LeaseId
	Attempt      wire.JobAttemptId
	GraceUntilMs uint64
}

// Alike in shape to LeaseRenewV1, but the third field is another thing (a
// grace deadline, not a phase): two messages of the API.
const nameLeaseProbe = "agent.LeaseProbeV1"

var maxLeaseProbeSize = 2*maxsize.ID + maxsize.U64

// MessageType implements wire.Message.
func (*LeaseProbeV1) MessageType() wire.MessageTypeId { return MsgLeaseProbe }

// AppendPostcard implements wire.Message.
func (m *LeaseProbeV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Lease.ULID[:]...)
	b = append(b, m.Attempt.ULID[:]...)
	return postcard.AppendU64(b, m.GraceUntilMs)
}

// DecodePostcard implements wire.Message.
func (m *LeaseProbeV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Lease.ULID)
	wire.ReadULID(d, &m.Attempt.ULID)
	m.GraceUntilMs = d.U64()
}

// Validate implements wire.Message.
func (m *LeaseProbeV1) Validate() error {
	if err := checkIDs(nameLeaseProbe, idField{"lease", m.Lease.ULID}, idField{"attempt", m.Attempt.ULID}); err != nil {
		return err
	}
	if m.GraceUntilMs == 0 {
		return invalid(nameLeaseProbe, "grace_until_ms", "zero")
	}
	return nil
}
