package cas

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

// NeedObjectsV1 lists the objects a lease's work needs (§88); the receiver
// answers with MissingObjectsV1.
//
//	struct NeedObjectsV1 { lease: [u8;16], objects: Vec<CasObjectRef> /* 1..=1024 */ }
type NeedObjectsV1 struct {
	Lease   wire.LeaseId
	Objects []wire.CasObjectRef
}

// MessageType implements wire.Message.
func (*NeedObjectsV1) MessageType() wire.MessageTypeId { return MsgNeedObjects }

// AppendPostcard implements wire.Message.
func (m *NeedObjectsV1) AppendPostcard(b []byte) []byte {
	return appendLeaseRefs(b, &m.Lease, m.Objects)
}

// DecodePostcard implements wire.Message. It reuses the capacity of m.Objects.
func (m *NeedObjectsV1) DecodePostcard(d *postcard.Decoder) {
	m.Objects = decodeLeaseRefs(d, &m.Lease, m.Objects)
}

// Validate implements wire.Message: the lease is required, the batch holds
// 1..=MaxBatch valid references.
func (m *NeedObjectsV1) Validate() error {
	return checkLeaseRefs("need objects", m.Lease, m.Objects, true)
}

// MissingObjectsV1 answers NeedObjectsV1 with the subset the receiver does
// not hold (§89); an empty list means nothing is missing.
//
//	struct MissingObjectsV1 { lease: [u8;16], objects: Vec<CasObjectRef> /* ≤ 1024 */ }
type MissingObjectsV1 struct {
	Lease   wire.LeaseId
	Objects []wire.CasObjectRef
}

// Alike in shape to NeedObjectsV1, but the answer, not the question (and an
// empty batch is valid here): one layout (appendLeaseRefs), two messages of
// the API.

// MessageType implements wire.Message.
func (*MissingObjectsV1) MessageType() wire.MessageTypeId { return MsgMissingObjects }

// AppendPostcard implements wire.Message.
func (m *MissingObjectsV1) AppendPostcard(b []byte) []byte {
	return appendLeaseRefs(b, &m.Lease, m.Objects)
}

// DecodePostcard implements wire.Message. It reuses the capacity of m.Objects.
func (m *MissingObjectsV1) DecodePostcard(d *postcard.Decoder) {
	m.Objects = decodeLeaseRefs(d, &m.Lease, m.Objects)
}

// Validate implements wire.Message: the lease is required, every reference
// valid.
func (m *MissingObjectsV1) Validate() error {
	return checkLeaseRefs("missing objects", m.Lease, m.Objects, false)
}

// NeedObjectsV1 and MissingObjectsV1 share one layout, {lease: [u8;16],
// objects: Vec<CasObjectRef> ≤ MaxBatch}, and one rule (a lease and valid
// references; at least one for NeedObjectsV1), encoded, decoded and checked
// once below. They stay two types: a request and its answer.
func appendLeaseRefs(b []byte, lease *wire.LeaseId, refs []wire.CasObjectRef) []byte {
	b = append(b, lease.ULID[:]...)
	return appendRefs(b, refs)
}

// decodeLeaseRefs reads the layout into lease and returns the references,
// reusing the capacity of refs.
func decodeLeaseRefs(d *postcard.Decoder, lease *wire.LeaseId, refs []wire.CasObjectRef) []wire.CasObjectRef {
	wire.ReadULID(d, &lease.ULID)
	return decodeRefs(d, refs)
}

// checkLeaseRefs validates the layout; nonEmpty rejects an empty batch.
func checkLeaseRefs(what string, lease wire.LeaseId, refs []wire.CasObjectRef, nonEmpty bool) error {
	if lease.IsZero() {
		return errInvalid(what + ": lease is required")
	}
	if nonEmpty && len(refs) == 0 {
		return errInvalid(what + ": empty batch")
	}
	return validRefs(refs, what)
}

// OutputsFinalizedV1 is the agent's outputs finalization barrier (§243):
// every output of the attempt is uploaded and verified, and no other output
// will follow. An attempt may have no outputs.
//
//	struct OutputsFinalizedV1 {
//	    attempt: [u8;16], lease: [u8;16], outputs: Vec<CasObjectRef> /* ≤ 1024 */,
//	}
type OutputsFinalizedV1 struct {
	Attempt wire.JobAttemptId
	Lease   wire.LeaseId
	Outputs []wire.CasObjectRef
}

// MessageType implements wire.Message.
func (*OutputsFinalizedV1) MessageType() wire.MessageTypeId { return MsgOutputsFinalized }

// AppendPostcard implements wire.Message.
func (m *OutputsFinalizedV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Attempt.ULID[:]...)
	b = append(b, m.Lease.ULID[:]...)
	return appendRefs(b, m.Outputs)
}

// DecodePostcard implements wire.Message. It reuses the capacity of m.Outputs.
func (m *OutputsFinalizedV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Attempt.ULID)
	wire.ReadULID(d, &m.Lease.ULID)
	m.Outputs = decodeRefs(d, m.Outputs)
}

// Validate implements wire.Message: attempt and lease are required, every
// reference valid.
func (m *OutputsFinalizedV1) Validate() error {
	if m.Attempt.IsZero() || m.Lease.IsZero() {
		return errInvalid("outputs finalized: attempt and lease are required")
	}
	return validRefs(m.Outputs, "outputs finalized")
}
