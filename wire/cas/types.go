// Package cas holds the V1 CAS-transfer protocol family (family 3, §87–93,
// §156, §234): which objects a lease needs or is missing, the small header
// that precedes the bytes of one object range on its own stream, range
// resume and fetch requests, per-object acknowledgement, and the outputs
// finalization barrier (§243).
//
// Object access is scoped to a lease (§93): every request names the lease
// that authorizes it, and a receiver checks that the object belongs to that
// lease's work. Offsets and lengths always count the object's logical bytes:
// transport compression is undone before the digest is verified (§91, §156).
//
// Every message is a wire type, distinct from the domain types that
// semantics/cas builds from it after Validate (§34, §260). Type numbers are
// explicit and stable (§159–160): never renumber, never reuse. Every length
// is bounded by a named constant that both Validate and the decoder enforce.
// AppendPostcard encodes exactly what it is given and never allocates beyond
// growing its buffer; call Validate before encoding a value built locally.
// Validate errors match postcard.ErrInvalidValue under errors.Is.
package cas

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/check"
	"forgeyard.dev/transport/wire/internal/seq"
	"forgeyard.dev/transport/wire/postcard"
)

// Alike in shape to the other families' id, type-number list and errInvalid,
// but each is its own family's frozen numbering and error prefix (API).
func id(v uint8) wire.MessageTypeId { return wire.TypeID(wire.FamilyCas, v) }

// Message type numbers of the cas family (family 3). Frozen.
var (
	MsgNeedObjects           = id(0x01)
	MsgMissingObjects        = id(0x02)
	MsgCasObjectStreamHeader = id(0x03)
	MsgCasRangeResumeRequest = id(0x04)
	MsgCasFetchRequest       = id(0x05)
	MsgCasObjectAck          = id(0x06)
	MsgOutputsFinalized      = id(0x07)
)

// MaxBatch bounds the object references of one NeedObjectsV1,
// MissingObjectsV1 or OutputsFinalizedV1 (§88).
const MaxBatch = 1024

// errInvalid reports a Validate failure. It matches postcard.ErrInvalidValue
// under errors.Is.
func errInvalid(what string) error { return check.Invalid("cas", what) }

// checkLeaseObject validates what every single-object message names: the
// lease that scopes the access (§93) and a valid object reference. what
// names the message in the error ("fetch request").
func checkLeaseObject(what string, lease wire.LeaseId, object *wire.CasObjectRef) error {
	if lease.IsZero() {
		return errInvalid(what + ": lease is required")
	}
	if !check.ValidRef(object) {
		return errInvalid(what + ": object with unknown algorithm or zero digest")
	}
	return nil
}

func validRefs(refs []wire.CasObjectRef, what string) error {
	if len(refs) > MaxBatch {
		return errInvalid(what + ": more than MaxBatch objects")
	}
	for i := range refs {
		if !check.ValidRef(&refs[i]) {
			return errInvalid(what + ": object with unknown algorithm or zero digest")
		}
	}
	return nil
}

func appendRefs(b []byte, refs []wire.CasObjectRef) []byte {
	return seq.Append(b, refs, (*wire.CasObjectRef).AppendPostcard)
}

// decodeRefs reads a Vec<CasObjectRef> of at most MaxBatch elements, reusing
// the capacity of refs.
func decodeRefs(d *postcard.Decoder, refs []wire.CasObjectRef) []wire.CasObjectRef {
	for r := range seq.Decode(d, &refs, MaxBatch, wire.CasObjectRefMinSize) {
		r.DecodePostcard(d)
	}
	return refs
}
