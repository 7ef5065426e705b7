// Package admin holds the V1 admin family (family 5, §97–98): the typed
// commands a daemon may send to an agent — drain, resume, refresh
// capabilities, run a health probe — and the agent's acknowledgement.
//
// No remote shell (§98) is a critical invariant: this family has no message,
// field or variant that carries a command line, arguments, a script, an
// environment or anything else an agent could execute. A new admin
// capability is a new typed message with a new type number, reviewed as
// such; a test walks every field of every message and fails on shell-like
// names. Work that runs code arrives only as a leased JobSpec.
//
// Every message is a wire type, distinct from the domain types built from it
// after Validate (§34, §260). Type numbers are explicit and stable
// (§159–160): never renumber, never reuse. Every length is bounded by a named
// constant that both Validate and the decoder enforce. AppendPostcard encodes
// exactly what it is given and never allocates beyond growing its buffer;
// call Validate before encoding a value built locally. Validate errors match
// postcard.ErrInvalidValue under errors.Is.
package admin

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/check"
)

// Alike in shape to the other families' id, type-number list and errInvalid,
// but each is its own family's frozen numbering and error prefix (API).
func id(v uint8) wire.MessageTypeId { return wire.TypeID(wire.FamilyAdmin, v) }

// Message type numbers of the admin family (family 5). Frozen.
var (
	MsgDrain               = id(0x01)
	MsgResume              = id(0x02)
	MsgRefreshCapabilities = id(0x03)
	MsgRunHealthProbe      = id(0x04)
	MsgAdminAck            = id(0x05)
)

// MaxText bounds the free-text fields of this family (DrainV1.Reason,
// AdminAckV1.Message), in bytes.
const MaxText = 256

// errInvalid reports a Validate failure. It matches postcard.ErrInvalidValue
// under errors.Is.
func errInvalid(what string) error { return check.Invalid("admin", what) }

// IsCommand reports whether t is one of the admin commands that AdminAckV1
// acknowledges (every admin message except AdminAckV1 itself).
func IsCommand(t wire.MessageTypeId) bool {
	switch t {
	case MsgDrain, MsgResume, MsgRefreshCapabilities, MsgRunHealthProbe:
		return true
	}
	return false
}
