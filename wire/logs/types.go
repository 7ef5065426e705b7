// Package logs holds the V1 log-stream protocol family (family 2, §83–86,
// §154–155, §243): the header that opens an attempt's unidirectional log
// stream, the log frames that follow it, resume and durability acks, and the
// finalization barrier that an agent passes before completing an attempt.
//
// Every message is a wire type, distinct from the domain types that
// semantics/logs builds from it after Validate (§34, §260). Type numbers are
// explicit and stable (§159–160): never renumber, never reuse.
//
// Bounds: every length is bounded by a named constant that both Validate and
// the decoder enforce. AppendPostcard encodes exactly what it is given and
// never allocates beyond growing its buffer; call Validate before encoding a
// value built locally, because a value that fails Validate may not decode at
// the peer. Validate errors match postcard.ErrInvalidValue under errors.Is.
//
// Sequences: log sequence numbers count frames per attempt and grow by one
// per frame; the first frame of a stream carries the header's FirstSeq.
// Timestamps are unix milliseconds.
package logs

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/check"
)

// Alike in shape to the other families' id, type-number list and errInvalid,
// but each is its own family's frozen numbering and error prefix (API).
func id(v uint8) wire.MessageTypeId { return wire.TypeID(wire.FamilyLogs, v) }

// Message type numbers of the logs family (family 2). Frozen.
var (
	MsgLogStreamHeader  = id(0x01)
	MsgLogFrame         = id(0x02)
	MsgLogResumeRequest = id(0x03)
	MsgLogAck           = id(0x04)
	MsgLogsFinalized    = id(0x05)
	MsgLogsFinalizedAck = id(0x06)
)

// errInvalid reports a Validate failure. It matches postcard.ErrInvalidValue
// under errors.Is.
func errInvalid(what string) error { return check.Invalid("logs", what) }
