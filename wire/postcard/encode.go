// Package postcard implements the Postcard 1.x wire format, byte-compatible
// with the Rust postcard crate (v1.1.x, 64-bit usize).
//
// Encoding is a set of Append functions that append to a caller's buffer and
// never allocate beyond growing it. Decoding is a Decoder over a []byte with a
// sticky error: after the first failure every read returns the zero value and
// Err reports the first error, so message decoders read field after field and
// check once at the end. Nothing in this package uses reflection.
//
// Bounds: every length read from the input (strings, bytes, sequences, maps)
// is checked against a caller-supplied bound and against the bytes that remain
// before anything is allocated, so a hostile input can never make a decoder
// allocate more than the input it was given or the declared bound.
package postcard

import (
	"math"
	"unicode/utf8"
)

// U128 is an unsigned 128-bit integer (Rust u128). I128 values use the same
// representation in two's complement.
type U128 struct {
	Hi, Lo uint64
}

// AppendUvarint appends v as an unsigned LEB128 varint (shortest form).
func AppendUvarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// UvarintLen reports how many bytes AppendUvarint writes for v.
func UvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// AppendU8 appends a raw byte.
func AppendU8(b []byte, v uint8) []byte { return append(b, v) }

// AppendI8 appends a raw two's-complement byte.
func AppendI8(b []byte, v int8) []byte { return append(b, byte(v)) }

// AppendBool appends 0x00 or 0x01.
func AppendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

// AppendU16 appends a u16 varint.
func AppendU16(b []byte, v uint16) []byte { return AppendUvarint(b, uint64(v)) }

// AppendU32 appends a u32 varint.
func AppendU32(b []byte, v uint32) []byte { return AppendUvarint(b, uint64(v)) }

// AppendU64 appends a u64 varint.
func AppendU64(b []byte, v uint64) []byte { return AppendUvarint(b, v) }

// AppendU128 appends a u128 varint.
func AppendU128(b []byte, v U128) []byte {
	for v.Hi != 0 || v.Lo >= 0x80 {
		b = append(b, byte(v.Lo)|0x80)
		v.Lo = v.Lo>>7 | v.Hi<<57
		v.Hi >>= 7
	}
	return append(b, byte(v.Lo))
}

// AppendI16 appends a zigzag-encoded i16.
func AppendI16(b []byte, v int16) []byte {
	return AppendUvarint(b, uint64(uint16(v<<1)^uint16(v>>15)))
}

// AppendI32 appends a zigzag-encoded i32.
func AppendI32(b []byte, v int32) []byte {
	return AppendUvarint(b, uint64(uint32(v<<1)^uint32(v>>31)))
}

// AppendI64 appends a zigzag-encoded i64.
func AppendI64(b []byte, v int64) []byte {
	return AppendUvarint(b, uint64(v<<1)^uint64(v>>63))
}

// AppendI128 appends a zigzag-encoded i128 given in two's complement.
func AppendI128(b []byte, v U128) []byte {
	sign := uint64(int64(v.Hi) >> 63) // all ones when negative
	z := U128{Hi: (v.Hi<<1 | v.Lo>>63) ^ sign, Lo: (v.Lo << 1) ^ sign}
	return AppendU128(b, z)
}

// AppendF32 appends the IEEE-754 bits little-endian.
func AppendF32(b []byte, v float32) []byte {
	u := math.Float32bits(v)
	return append(b, byte(u), byte(u>>8), byte(u>>16), byte(u>>24))
}

// AppendF64 appends the IEEE-754 bits little-endian.
func AppendF64(b []byte, v float64) []byte {
	u := math.Float64bits(v)
	return append(b, byte(u), byte(u>>8), byte(u>>16), byte(u>>24),
		byte(u>>32), byte(u>>40), byte(u>>48), byte(u>>56))
}

// AppendChar appends a char as varint(len) followed by its UTF-8 bytes. An
// invalid rune is encoded as U+FFFD, as Go's utf8 package does.
func AppendChar(b []byte, r rune) []byte {
	n := utf8.RuneLen(r)
	if n < 0 {
		r, n = utf8.RuneError, 3
	}
	b = append(b, byte(n))
	return utf8.AppendRune(b, r)
}

// AppendString appends varint(len) followed by the bytes of s. The caller is
// responsible for s being valid UTF-8 (wire types validate before encoding).
func AppendString(b []byte, s string) []byte {
	b = AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// AppendBytes appends varint(len) followed by p (serde_bytes encoding).
func AppendBytes(b []byte, p []byte) []byte {
	b = AppendUvarint(b, uint64(len(p)))
	return append(b, p...)
}

// AppendOption appends an Option tag: 0x01 when present, 0x00 when absent.
// The caller appends the value after a present tag.
func AppendOption(b []byte, present bool) []byte { return AppendBool(b, present) }

// AppendLen appends a sequence, map, string or bytes length (usize varint).
func AppendLen(b []byte, n int) []byte { return AppendUvarint(b, uint64(n)) }

// AppendVariant appends an enum discriminant (u32 varint).
func AppendVariant(b []byte, v uint32) []byte { return AppendUvarint(b, uint64(v)) }
