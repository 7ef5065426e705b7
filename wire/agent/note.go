package agent

import (
	"github.com/oklog/ulid/v2"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/maxsize"
	"forgeyard.dev/transport/wire/postcard"
)

// CancelAttemptV1, CompletionAckV1 and LeaseRejectedV1 share one layout, a
// note on one attempt under one lease: the two ids (attempt then lease in
// the first two, lease then attempt in LeaseRejectedV1), a unit enum (the
// reason or kind) and a free-text message truncated to MaxMessage on
// encode:
//
//	{ [u8;16], [u8;16], code: enum, message: String }
//
// The functions below encode, decode and validate that layout once; each
// type passes its fields in wire order, its enum's count and its field
// names. They stay three types: the enum is a different one in each.

var noteMaxSize = 2*maxsize.ID + maxsize.Enum + maxsize.Bytes(MaxMessage)

func appendNote(b []byte, first, second *ulid.ULID, code uint32, message string) []byte {
	b = append(b, first[:]...)
	b = append(b, second[:]...)
	b = postcard.AppendVariant(b, code)
	return postcard.AppendString(b, truncateText(message, MaxMessage))
}

// decodeNote reads the layout into first, second and message and returns
// the code, a discriminant below numCodes.
func decodeNote(d *postcard.Decoder, first, second *ulid.ULID, numCodes uint32, message *string) uint32 {
	wire.ReadULID(d, first)
	wire.ReadULID(d, second)
	code := d.Variant(numCodes)
	*message = d.String(MaxMessage)
	return code
}

// checkNote validates the layout: non-zero ids, a code this build defines
// (codeValid; otherwise codeField is "unknown <codeField>") and a UTF-8
// message.
func checkNote(msg string, first, second idField, codeField string, codeValid bool, message string) error {
	if err := checkIDs(msg, first, second); err != nil {
		return err
	}
	if !codeValid {
		return invalid(msg, codeField, "unknown "+codeField)
	}
	return checkText(msg, "message", message)
}
