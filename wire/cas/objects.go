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
	b = append(b, m.Lease.ULID[:]...)
	return appendRefs(b, m.Objects)
}

// DecodePostcard implements wire.Message. It reuses the capacity of m.Objects.
func (m *NeedObjectsV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Lease.ULID)
	m.Objects = decodeRefs(d, m.Objects)
}

// Validate implements wire.Message: the lease is required, the batch holds
// 1..=MaxBatch valid references.
func (m *NeedObjectsV1) Validate() error {
	if m.Lease.IsZero() {
		return errInvalid("need objects: lease is required")
	}
	if len(m.Objects) == 0 {
		return errInvalid("need objects: empty batch")
	}
	return validRefs(m.Objects, "need objects")
}

// MissingObjectsV1 answers NeedObjectsV1 with the subset the receiver does
// not hold (§89); an empty list means nothing is missing.
//
//	struct MissingObjectsV1 { lease: [u8;16], objects: Vec<CasObjectRef> /* ≤ 1024 */ }
type MissingObjectsV1 struct {
	Lease   wire.LeaseId
	Objects []wire.CasObjectRef
}

// MessageType implements wire.Message.
func (*MissingObjectsV1) MessageType() wire.MessageTypeId { return MsgMissingObjects }

// AppendPostcard implements wire.Message.
func (m *MissingObjectsV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Lease.ULID[:]...)
	return appendRefs(b, m.Objects)
}

// DecodePostcard implements wire.Message. It reuses the capacity of m.Objects.
func (m *MissingObjectsV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Lease.ULID)
	m.Objects = decodeRefs(d, m.Objects)
}

// Validate implements wire.Message: the lease is required, every reference
// valid.
func (m *MissingObjectsV1) Validate() error {
	if m.Lease.IsZero() {
		return errInvalid("missing objects: lease is required")
	}
	return validRefs(m.Objects, "missing objects")
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
