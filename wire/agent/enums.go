package agent

import (
	"log/slog"

	"forgeyard.dev/transport/wire/internal/enum"
)

// Unit-only enums of the agent family. Each is a Postcard enum: a u32 varint
// discriminant. The values are explicit and stable (§54): never renumber,
// add new values at the end in a new protocol minor version. Decoders reject
// discriminants at or above the num* count with postcard.ErrBadEnum.

// PeerRole is the role a connecting peer claims in TransportHelloV1 (§59).
// The daemon checks it against the role bound to the peer's certificate.
type PeerRole uint32

// Peer roles.
const (
	RoleAgent          PeerRole = 0
	RoleDeviceAgent    PeerRole = 1
	RoleSigningWorker  PeerRole = 2
	RoleInternalWorker PeerRole = 3

	numPeerRoles = 4
)

// Valid reports whether r is a role this build defines.
func (r PeerRole) Valid() bool { return r < numPeerRoles }

// String returns the variant name, or "PeerRole(n)" for a value this build
// does not define.
func (r PeerRole) String() string { return enum.Name(peerRoleNames[:], r, "PeerRole") }

var peerRoleNames = [...]string{
	RoleAgent: "Agent", RoleDeviceAgent: "DeviceAgent", RoleSigningWorker: "SigningWorker",
	RoleInternalWorker: "InternalWorker",
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (r PeerRole) LogValue() slog.Value { return slog.StringValue(r.String()) }

// Valid reports whether p is a phase this build defines.
func (p AttemptPhase) Valid() bool { return p < numPhases }

// LeaseRejectReason says why an agent refused a lease offer (§69).
type LeaseRejectReason uint32

// Lease reject reasons.
const (
	RejectAtCapacity       LeaseRejectReason = 0 // no free execution slot
	RejectUnsupportedSpec  LeaseRejectReason = 1 // the spec needs a capability this runner lacks
	RejectSpecUnavailable  LeaseRejectReason = 2 // the spec could not be fetched or verified (§66)
	RejectDraining         LeaseRejectReason = 3 // the agent is shutting down
	RejectDuplicateAttempt LeaseRejectReason = 4 // the attempt already runs under another lease
	RejectExpired          LeaseRejectReason = 5 // the offer arrived after its expiry
	RejectOther            LeaseRejectReason = 6 // see the message

	numLeaseRejectReasons = 7
)

// Valid reports whether r is a reason this build defines.
func (r LeaseRejectReason) Valid() bool { return r < numLeaseRejectReasons }

// String returns the variant name, or "LeaseRejectReason(n)" for a value this build
// does not define.
func (r LeaseRejectReason) String() string {
	return enum.Name(leaseRejectReasonNames[:], r, "LeaseRejectReason")
}

var leaseRejectReasonNames = [...]string{
	RejectAtCapacity: "AtCapacity", RejectUnsupportedSpec: "UnsupportedSpec",
	RejectSpecUnavailable: "SpecUnavailable", RejectDraining: "Draining",
	RejectDuplicateAttempt: "DuplicateAttempt", RejectExpired: "Expired", RejectOther: "Other",
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (r LeaseRejectReason) LogValue() slog.Value { return slog.StringValue(r.String()) }

// CancellationReason says why an attempt is cancelled (§72).
type CancellationReason uint32

// Cancellation reasons.
const (
	CancelUserRequested   CancellationReason = 0
	CancelSuperseded      CancellationReason = 1 // a newer attempt replaced this one
	CancelTimeout         CancellationReason = 2 // the job's time limit was reached
	CancelLeaseRevoked    CancellationReason = 3 // the daemon no longer holds the lease for this agent
	CancelRunnerDraining  CancellationReason = 4
	CancelPolicyViolation CancellationReason = 5
	CancelOther           CancellationReason = 6 // see the message

	numCancellationReasons = 7
)

// Valid reports whether r is a reason this build defines.
func (r CancellationReason) Valid() bool { return r < numCancellationReasons }

// String returns the variant name, or "CancellationReason(n)" for a value this build
// does not define.
func (r CancellationReason) String() string {
	return enum.Name(cancellationReasonNames[:], r, "CancellationReason")
}

// Alike in shape to the other enums here (Valid, String by enum.Name,
// LogValue), but each is its own enum of the API with its own names.
var cancellationReasonNames = [...]string{
	CancelUserRequested: "UserRequested", CancelSuperseded: "Superseded",
	CancelTimeout: "Timeout", CancelLeaseRevoked: "LeaseRevoked",
	CancelRunnerDraining: "RunnerDraining", CancelPolicyViolation: "PolicyViolation",
	CancelOther: "Other",
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (r CancellationReason) LogValue() slog.Value { return slog.StringValue(r.String()) }

// CompletionAckKind is the daemon's verdict on an AttemptCompletionV1 (§76).
type CompletionAckKind uint32

// Completion ack kinds.
const (
	AckAccepted          CompletionAckKind = 0 // recorded now
	AckDuplicateAccepted CompletionAckKind = 1 // already recorded under the same MessageId: stop retrying
	AckStaleRejected     CompletionAckKind = 2 // lease or attempt no longer current: discard
	AckInvalidRejected   CompletionAckKind = 3 // the completion failed validation: do not retry

	numCompletionAckKinds = 4
)

// Valid reports whether k is a kind this build defines.
func (k CompletionAckKind) Valid() bool { return k < numCompletionAckKinds }

// String returns the variant name, or "CompletionAckKind(n)" for a value this build
// does not define.
func (k CompletionAckKind) String() string {
	return enum.Name(completionAckKindNames[:], k, "CompletionAckKind")
}

var completionAckKindNames = [...]string{
	AckAccepted: "Accepted", AckDuplicateAccepted: "DuplicateAccepted",
	AckStaleRejected: "StaleRejected", AckInvalidRejected: "InvalidRejected",
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (k CompletionAckKind) LogValue() slog.Value { return slog.StringValue(k.String()) }
