// Package health holds the V1 health protocol family (family 4, §96, §213):
// an agent's health summary, and the probes a daemon may request
// selectively (doctor-style checks of connectivity, disk and clock).
//
// Every message is a wire type, distinct from the domain types built from it
// after Validate (§34, §260). Type numbers are explicit and stable
// (§159–160): never renumber, never reuse. Every length is bounded by a named
// constant that both Validate and the decoder enforce. AppendPostcard encodes
// exactly what it is given and never allocates beyond growing its buffer;
// call Validate before encoding a value built locally. Validate errors match
// postcard.ErrInvalidValue under errors.Is.
package health

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/check"
)

// Alike in shape to the other families' id, type-number list and errInvalid,
// but each is its own family's frozen numbering and error prefix (API).
func id(v uint8) wire.MessageTypeId { return wire.TypeID(wire.FamilyHealth, v) }

// Message type numbers of the health family (family 4). Frozen.
var (
	MsgHealthSummary = id(0x01)
	MsgProbeRequest  = id(0x02)
	MsgProbeResponse = id(0x03)
)

// errInvalid reports a Validate failure. It matches postcard.ErrInvalidValue
// under errors.Is.
func errInvalid(what string) error { return check.Invalid("health", what) }
