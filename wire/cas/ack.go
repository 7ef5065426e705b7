package cas

import (
	"log/slog"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/enum"
	"forgeyard.dev/transport/wire/postcard"
)

// CasOutcome is the receiver's verdict on one object transfer (§91).
// Postcard enum.
type CasOutcome uint32

// CAS transfer outcomes.
const (
	CasVerified       CasOutcome = 0 // complete and the digest matched
	CasDigestMismatch CasOutcome = 1 // complete but the digest did not match
	CasForbidden      CasOutcome = 2 // the lease does not authorize this object (§93)
	CasNotFound       CasOutcome = 3 // the object is unknown to the sender
	CasSizeMismatch   CasOutcome = 4 // the stream ended before or after the declared size
	CasAborted        CasOutcome = 5 // the transfer was abandoned (cancel, shutdown)

	numCasOutcomes = 6
)

var outcomeNames = [numCasOutcomes]string{"Verified", "DigestMismatch", "Forbidden", "NotFound", "SizeMismatch", "Aborted"}

// String returns the outcome's name, or CasOutcome(n) for an undefined value.
func (o CasOutcome) String() string { return enum.Name(outcomeNames[:], o, "CasOutcome") }

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (o CasOutcome) LogValue() slog.Value { return slog.StringValue(o.String()) }

// CasObjectAckV1 reports the outcome of one object transfer. VerifiedOffset
// is the length of the verified prefix the receiver keeps, from which a later
// CasRangeResumeRequestV1 may continue.
//
//	struct CasObjectAckV1 {
//	    lease: [u8;16], object: CasObjectRef,
//	    outcome: CasOutcome,     // Verified=0, DigestMismatch=1, Forbidden=2,
//	                             // NotFound=3, SizeMismatch=4, Aborted=5
//	    verified_offset: u64,    // ≤ object.size; == object.size when Verified
//	}
type CasObjectAckV1 struct {
	Lease          wire.LeaseId
	Object         wire.CasObjectRef
	Outcome        CasOutcome
	VerifiedOffset uint64
}

// MessageType implements wire.Message.
func (*CasObjectAckV1) MessageType() wire.MessageTypeId { return MsgCasObjectAck }

// AppendPostcard implements wire.Message.
func (m *CasObjectAckV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Lease.ULID[:]...)
	b = m.Object.AppendPostcard(b)
	b = postcard.AppendVariant(b, uint32(m.Outcome))
	return postcard.AppendU64(b, m.VerifiedOffset)
}

// DecodePostcard implements wire.Message.
func (m *CasObjectAckV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Lease.ULID)
	m.Object.DecodePostcard(d)
	m.Outcome = CasOutcome(d.Variant(numCasOutcomes))
	m.VerifiedOffset = d.U64()
}

// Validate implements wire.Message: the lease is required, the object valid,
// the outcome known, VerifiedOffset ≤ size, and a Verified outcome covers
// the whole object.
func (m *CasObjectAckV1) Validate() error {
	if err := checkLeaseObject("object ack", m.Lease, &m.Object); err != nil {
		return err
	}
	if m.Outcome >= numCasOutcomes {
		return errInvalid("object ack: unknown outcome")
	}
	if m.VerifiedOffset > m.Object.Size {
		return errInvalid("object ack: verified offset beyond the object's size")
	}
	if m.Outcome == CasVerified && m.VerifiedOffset != m.Object.Size {
		return errInvalid("object ack: verified outcome for a partial object")
	}
	return nil
}
