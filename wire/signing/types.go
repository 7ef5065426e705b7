// Package signing holds the V1 signing-worker family (family 6, §99): typed
// sign requests that name a key, a subject digest, the CAS material the
// signature covers and a policy proof authorizing it, and the worker's
// response.
//
// The family is separate from agent execution: a signing worker signs a
// digest under a policy and never runs anything — there is no command,
// script or execution message here (§98–99).
//
// Every message is a wire type, distinct from the domain types built from it
// after Validate (§34, §260). Type numbers are explicit and stable
// (§159–160): never renumber, never reuse. Every length is bounded by a named
// constant that both Validate and the decoder enforce. AppendPostcard encodes
// exactly what it is given and never allocates beyond growing its buffer;
// call Validate before encoding a value built locally. Decoded byte fields
// are copies (they do not alias the input). Validate errors match
// postcard.ErrInvalidValue under errors.Is.
package signing

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/check"
)

// Alike in shape to the other families' id, type-number list and errInvalid,
// but each is its own family's frozen numbering and error prefix (API).
func id(v uint8) wire.MessageTypeId { return wire.TypeID(wire.FamilySigning, v) }

// Message type numbers of the signing family (family 6). Frozen.
var (
	MsgSignRequest  = id(0x01)
	MsgSignResponse = id(0x02)
)

// Bounds of the signing family, in bytes or elements.
const (
	MaxKeyRef       = 128  // SignRequestV1.KeyRef, bytes
	MaxMaterialRefs = 64   // SignRequestV1.MaterialRefs, elements
	MaxPolicyID     = 128  // PolicyProofV1.PolicyID, bytes
	MaxAttestation  = 8192 // PolicyProofV1.Attestation, bytes
	MaxSignature    = 1024 // SignOutcomeV1.Signature, bytes
	MaxChain        = 4    // SignOutcomeV1.Chain, certificates
	MaxChainCert    = 8192 // one DER certificate of SignOutcomeV1.Chain, bytes
	MaxReason       = 256  // SignOutcomeV1.Reason, bytes
)

// errInvalid reports a Validate failure. It matches postcard.ErrInvalidValue
// under errors.Is.
func errInvalid(what string) error { return check.Invalid("signing", what) }

// validText reports whether s is 1..=max bytes of UTF-8.
func validText(s string, max int) bool { return check.Text(s, max, true) }
