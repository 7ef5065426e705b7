// Package maxsize holds the largest Postcard encodings of the building
// blocks from which the family packages derive each message's MaxSize
// (logs, cas, health, admin, signing, device): one copy of each varint
// width and of the string and sequence rules. It is wire's own (no
// promise).
package maxsize

import "forgeyard.dev/transport/wire/postcard"

// Largest encodings, in bytes.
const (
	U16    = 3                   // u16 varint
	U32    = 5                   // u32 varint
	U64    = 10                  // u64 varint
	I32    = 5                   // zigzag i32 varint
	Bool   = 1                   // bool
	Option = 1                   // Option tag
	Enum   = 1                   // enum discriminant below 128 (every family's)
	ID     = 16                  // ULID, [u8;16]
	Digest = 32                  // [u8;32]
	Ref    = Enum + Digest + U64 // wire.CasObjectRef
)

// Bytes is the largest encoding of a string or byte string of at most max
// bytes: its length prefix and the bytes.
func Bytes(max int) int { return postcard.UvarintLen(uint64(max)) + max }

// Seq is the largest encoding of a sequence of at most n elements of at
// most elem bytes each: its count prefix and the elements.
func Seq(n, elem int) int { return postcard.UvarintLen(uint64(n)) + n*elem }
