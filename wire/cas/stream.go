package cas

import (
	"log/slog"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/enum"
	"forgeyard.dev/transport/wire/postcard"
)

// CasCompression is how the bytes that follow a CasObjectStreamHeaderV1 are
// encoded (§156). Postcard enum.
type CasCompression uint32

// CAS compressions.
const (
	// CasCompressionNone: the stream carries the object's bytes as they are.
	CasCompressionNone CasCompression = 0
	// CasCompressionFlate: the stream carries one raw DEFLATE (RFC 1951)
	// stream of the range; the receiver decompresses, bounded by Length,
	// before verifying the digest.
	CasCompressionFlate CasCompression = 1

	numCasCompressions = 2
)

// String returns the compression's name (None, Flate), or CasCompression(n) for an undefined value.
func (c CasCompression) String() string {
	return enum.Name(casCompressionNames[:], c, "CasCompression")
}

// Alike in shape to wire.DigestAlgorithm and the families' other enums, but
// each is its own enum of the API with its own names.
var casCompressionNames = [...]string{CasCompressionNone: "None", CasCompressionFlate: "Flate"}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (c CasCompression) LogValue() slog.Value { return slog.StringValue(c.String()) }

// rangeWithin reports whether [offset, offset+length) lies within size bytes,
// without overflow.
func rangeWithin(offset, length, size uint64) bool {
	return offset <= size && length <= size-offset
}

// CasObjectStreamHeaderV1 opens the dedicated stream of one object transfer
// (§37, §90); the range's bytes follow it on the stream, never inside a
// message. Offset and Length count the object's logical bytes.
//
//	struct CasObjectStreamHeaderV1 {
//	    lease: [u8;16], object: CasObjectRef,
//	    offset: u64, length: u64,   // offset + length ≤ object.size
//	    compression: CasCompression, // None=0, Flate=1
//	}
type CasObjectStreamHeaderV1 struct {
	Lease       wire.LeaseId
	Object      wire.CasObjectRef
	Offset      uint64
	Length      uint64
	Compression CasCompression
}

// MessageType implements wire.Message.
func (*CasObjectStreamHeaderV1) MessageType() wire.MessageTypeId {
	return MsgCasObjectStreamHeader
}

// AppendPostcard implements wire.Message.
func (m *CasObjectStreamHeaderV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Lease.ULID[:]...)
	b = m.Object.AppendPostcard(b)
	b = postcard.AppendU64(b, m.Offset)
	b = postcard.AppendU64(b, m.Length)
	return postcard.AppendVariant(b, uint32(m.Compression))
}

// DecodePostcard implements wire.Message.
func (m *CasObjectStreamHeaderV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Lease.ULID)
	m.Object.DecodePostcard(d)
	m.Offset = d.U64()
	m.Length = d.U64()
	m.Compression = CasCompression(d.Variant(numCasCompressions))
}

// Validate implements wire.Message: the lease is required, the object valid,
// the range within the object (offset+length ≤ size, checked without
// overflow) and the compression known.
func (m *CasObjectStreamHeaderV1) Validate() error {
	if err := checkLeaseObject("object stream header", m.Lease, &m.Object); err != nil {
		return err
	}
	if !rangeWithin(m.Offset, m.Length, m.Object.Size) {
		return errInvalid("object stream header: range beyond the object's size")
	}
	if m.Compression >= numCasCompressions {
		return errInvalid("object stream header: unknown compression")
	}
	return nil
}

// CasRangeResumeRequestV1 resumes an interrupted transfer (§92, §234): the
// sender holds a verified local prefix of the object up to VerifiedOffset
// and asks to continue from there. It is only sent after the local partial
// state was verified.
//
//	struct CasRangeResumeRequestV1 { lease: [u8;16], object: CasObjectRef, verified_offset: u64 }
type CasRangeResumeRequestV1 struct {
	Lease          wire.LeaseId
	Object         wire.CasObjectRef
	VerifiedOffset uint64
}

// MessageType implements wire.Message.
func (*CasRangeResumeRequestV1) MessageType() wire.MessageTypeId {
	return MsgCasRangeResumeRequest
}

// AppendPostcard implements wire.Message.
func (m *CasRangeResumeRequestV1) AppendPostcard(b []byte) []byte {
	return appendObjectOffset(b, &m.Lease, &m.Object, m.VerifiedOffset)
}

// DecodePostcard implements wire.Message.
func (m *CasRangeResumeRequestV1) DecodePostcard(d *postcard.Decoder) {
	m.VerifiedOffset = decodeObjectOffset(d, &m.Lease, &m.Object)
}

// Validate implements wire.Message: the lease is required, the object valid
// and VerifiedOffset ≤ its size.
func (m *CasRangeResumeRequestV1) Validate() error {
	return checkObjectOffset("range resume request", "verified offset", m.Lease, &m.Object, m.VerifiedOffset)
}

// CasFetchRequestV1 asks for a download of an object from Offset to its end;
// the peer answers on a new stream opened with CasObjectStreamHeaderV1.
//
//	struct CasFetchRequestV1 { lease: [u8;16], object: CasObjectRef, offset: u64 }
type CasFetchRequestV1 struct {
	Lease  wire.LeaseId
	Object wire.CasObjectRef
	Offset uint64
}

// Alike in shape to CasRangeResumeRequestV1, but a download's start, not an
// upload's resume: one layout (appendObjectOffset), two messages of the API.

// MessageType implements wire.Message.
func (*CasFetchRequestV1) MessageType() wire.MessageTypeId { return MsgCasFetchRequest }

// AppendPostcard implements wire.Message.
func (m *CasFetchRequestV1) AppendPostcard(b []byte) []byte {
	return appendObjectOffset(b, &m.Lease, &m.Object, m.Offset)
}

// DecodePostcard implements wire.Message.
func (m *CasFetchRequestV1) DecodePostcard(d *postcard.Decoder) {
	m.Offset = decodeObjectOffset(d, &m.Lease, &m.Object)
}

// Validate implements wire.Message: the lease is required, the object valid
// and Offset ≤ its size.
func (m *CasFetchRequestV1) Validate() error {
	return checkObjectOffset("fetch request", "offset", m.Lease, &m.Object, m.Offset)
}

// CasRangeResumeRequestV1 and CasFetchRequestV1 share one layout, {lease:
// [u8;16], object: CasObjectRef, u64}, and one rule (a lease, a valid object
// and an offset within its size), encoded, decoded and checked once below.
// They stay two types: the offset is a verified prefix the sender holds in
// one and where a download starts in the other.
func appendObjectOffset(b []byte, lease *wire.LeaseId, object *wire.CasObjectRef, offset uint64) []byte {
	b = append(b, lease.ULID[:]...)
	b = object.AppendPostcard(b)
	return postcard.AppendU64(b, offset)
}

// decodeObjectOffset reads the layout into lease and object and returns the
// offset.
func decodeObjectOffset(d *postcard.Decoder, lease *wire.LeaseId, object *wire.CasObjectRef) uint64 {
	wire.ReadULID(d, &lease.ULID)
	object.DecodePostcard(d)
	return d.U64()
}

// checkObjectOffset validates the layout; offsetName names the offset in
// the error ("<what>: <offsetName> beyond the object's size").
func checkObjectOffset(what, offsetName string, lease wire.LeaseId, object *wire.CasObjectRef, offset uint64) error {
	if err := checkLeaseObject(what, lease, object); err != nil {
		return err
	}
	if offset > object.Size {
		return errInvalid(what + ": " + offsetName + " beyond the object's size")
	}
	return nil
}
