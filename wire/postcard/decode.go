package postcard

import (
	"math"
	"unicode/utf8"
)

// Decoder reads Postcard values from a byte slice. The zero value decodes an
// empty input. A Decoder is not safe for concurrent use.
//
// Errors are sticky: after the first failure every method returns the zero
// value and Err returns that first failure. Slices returned by BytesRef alias
// the input and are valid as long as the input is.
type Decoder struct {
	buf []byte
	off int
	err *Error
}

// NewDecoder returns a Decoder over b. It does not copy b.
func NewDecoder(b []byte) Decoder { return Decoder{buf: b} }

// Reset makes d decode b from the start, clearing any error.
func (d *Decoder) Reset(b []byte) { *d = Decoder{buf: b} }

// Err returns the first error, or nil.
func (d *Decoder) Err() error {
	if d.err == nil {
		return nil
	}
	return d.err
}

// Failed reports whether an error has occurred.
func (d *Decoder) Failed() bool { return d.err != nil }

// Offset returns the number of bytes consumed.
func (d *Decoder) Offset() int { return d.off }

// Remaining returns the number of unread bytes.
func (d *Decoder) Remaining() int { return len(d.buf) - d.off }

// Rest returns the unread bytes (aliasing the input).
func (d *Decoder) Rest() []byte { return d.buf[d.off:] }

// Fail records err (if no error is recorded yet) at the current offset. Wire
// types use it to report validation failures with CodeInvalidValue or
// CodeBadEnum.
func (d *Decoder) Fail(code Code, detail string) {
	if d.err == nil {
		d.err = &Error{Code: code, Offset: d.off, Detail: detail}
	}
}

func (d *Decoder) failAt(code Code, off int, detail string) {
	if d.err == nil {
		d.err = &Error{Code: code, Offset: off, Detail: detail}
	}
}

// Finish records CodeTrailingBytes if input remains and returns Err. Use it
// when a value must fill its frame exactly (Rust's from_bytes would ignore
// trailing bytes; our frames are strict).
func (d *Decoder) Finish() error {
	if d.err == nil && d.off != len(d.buf) {
		d.failAt(CodeTrailingBytes, d.off, "")
	}
	return d.Err()
}

// varint reads an unsigned LEB128 varint of at most maxLen bytes whose final
// byte may not exceed lastMax when it is the maxLen-th byte.
func (d *Decoder) varint(maxLen int, lastMax byte) uint64 {
	if d.err != nil {
		return 0
	}
	start := d.off
	var v uint64
	for i := 0; i < maxLen; i++ {
		if d.off >= len(d.buf) {
			d.failAt(CodeUnexpectedEnd, start, "varint")
			return 0
		}
		c := d.buf[d.off]
		d.off++
		if c < 0x80 {
			if i == maxLen-1 && c > lastMax {
				d.failAt(CodeBadVarint, start, "")
				return 0
			}
			return v | uint64(c)<<(7*uint(i))
		}
		v |= uint64(c&0x7f) << (7 * uint(i))
	}
	d.failAt(CodeBadVarint, start, "")
	return 0
}

// U8 reads a raw byte.
func (d *Decoder) U8() uint8 {
	if d.err != nil {
		return 0
	}
	if d.off >= len(d.buf) {
		d.failAt(CodeUnexpectedEnd, d.off, "u8")
		return 0
	}
	c := d.buf[d.off]
	d.off++
	return c
}

// I8 reads a raw two's-complement byte.
func (d *Decoder) I8() int8 { return int8(d.U8()) }

// Bool reads 0x00 or 0x01.
func (d *Decoder) Bool() bool { return d.zeroOrOne(CodeBadBool) }

// Option reads an Option tag and reports whether a value follows.
func (d *Decoder) Option() bool { return d.zeroOrOne(CodeBadOption) }

// zeroOrOne reads a byte that must be 0x00 or 0x01 (a bool, an Option tag),
// failing with bad at its offset otherwise.
func (d *Decoder) zeroOrOne(bad Code) bool {
	off := d.off
	c := d.U8()
	if c > 1 {
		d.failAt(bad, off, "")
		return false
	}
	return c == 1
}

// U16 reads a u16 varint (at most 3 bytes).
func (d *Decoder) U16() uint16 { return uint16(d.varint(3, 0x03)) }

// U32 reads a u32 varint (at most 5 bytes).
func (d *Decoder) U32() uint32 { return uint32(d.varint(5, 0x0f)) }

// U64 reads a u64 varint (at most 10 bytes).
func (d *Decoder) U64() uint64 {
	// Fast path: one-byte values.
	if d.err == nil && d.off < len(d.buf) && d.buf[d.off] < 0x80 {
		c := d.buf[d.off]
		d.off++
		return uint64(c)
	}
	return d.varint(10, 0x01)
}

// U128 reads a u128 varint (at most 19 bytes).
func (d *Decoder) U128() U128 {
	if d.err != nil {
		return U128{}
	}
	start := d.off
	var v U128
	for i := 0; i < 19; i++ {
		if d.off >= len(d.buf) {
			d.failAt(CodeUnexpectedEnd, start, "varint")
			return U128{}
		}
		c := d.buf[d.off]
		d.off++
		shift := 7 * uint(i)
		bits := uint64(c & 0x7f)
		if shift < 64 {
			v.Lo |= bits << shift
			if shift > 57 {
				v.Hi |= bits >> (64 - shift)
			}
		} else {
			v.Hi |= bits << (shift - 64)
		}
		if c < 0x80 {
			if i == 18 && c > 0x03 {
				d.failAt(CodeBadVarint, start, "")
				return U128{}
			}
			return v
		}
	}
	d.failAt(CodeBadVarint, start, "")
	return U128{}
}

// I16 reads a zigzag i16.
func (d *Decoder) I16() int16 {
	u := d.U16()
	return int16(u>>1) ^ -int16(u&1)
}

// I32 reads a zigzag i32.
func (d *Decoder) I32() int32 {
	u := d.U32()
	return int32(u>>1) ^ -int32(u&1)
}

// I64 reads a zigzag i64.
func (d *Decoder) I64() int64 {
	u := d.U64()
	return int64(u>>1) ^ -int64(u&1)
}

// I128 reads a zigzag i128 and returns it in two's complement.
func (d *Decoder) I128() U128 {
	z := d.U128()
	sign := -(z.Lo & 1) // all ones when negative
	return U128{Hi: (z.Hi >> 1) ^ sign, Lo: (z.Lo>>1 | z.Hi<<63) ^ sign}
}

func (d *Decoder) fixed(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.buf)-d.off < n {
		d.failAt(CodeUnexpectedEnd, d.off, what)
		return nil
	}
	p := d.buf[d.off : d.off+n]
	d.off += n
	return p
}

// F32 reads 4 bytes of little-endian IEEE-754 bits.
func (d *Decoder) F32() float32 {
	p := d.fixed(4, "f32")
	if p == nil {
		return 0
	}
	return math.Float32frombits(uint32(p[0]) | uint32(p[1])<<8 | uint32(p[2])<<16 | uint32(p[3])<<24)
}

// F64 reads 8 bytes of little-endian IEEE-754 bits.
func (d *Decoder) F64() float64 {
	p := d.fixed(8, "f64")
	if p == nil {
		return 0
	}
	u := uint64(p[0]) | uint64(p[1])<<8 | uint64(p[2])<<16 | uint64(p[3])<<24 |
		uint64(p[4])<<32 | uint64(p[5])<<40 | uint64(p[6])<<48 | uint64(p[7])<<56
	return math.Float64frombits(u)
}

// Char reads a char: varint(len 1..4) then UTF-8. Like the Rust crate, a
// payload holding more than one char yields the first and ignores the rest.
func (d *Decoder) Char() rune {
	start := d.off
	n := d.varint(10, 0x01)
	if d.err != nil {
		return 0
	}
	if n > 4 || n == 0 {
		d.failAt(CodeBadChar, start, "")
		return 0
	}
	p := d.fixed(int(n), "char")
	if p == nil {
		return 0
	}
	if !utf8.Valid(p) {
		d.failAt(CodeBadChar, start, "")
		return 0
	}
	r, _ := utf8.DecodeRune(p)
	return r
}

// Len reads a usize length and checks it against max (CodeLengthOverBound;
// a negative max admits only 0). It does not check the remaining input; see
// BytesLen and SeqLen.
func (d *Decoder) Len(max int) int {
	start := d.off
	n := d.varint(10, 0x01)
	if d.err != nil {
		return 0
	}
	if max < 0 {
		max = 0 // uint64(max) would wrap to "no bound"
	}
	if n > uint64(max) {
		d.failAt(CodeLengthOverBound, start, "")
		return 0
	}
	return int(n)
}

// BytesLen reads the length of a byte-like value (bytes, string) bounded by
// max and by the remaining input.
func (d *Decoder) BytesLen(max int) int {
	start := d.off
	n := d.Len(max)
	if d.err == nil && n > len(d.buf)-d.off {
		d.failAt(CodeUnexpectedEnd, start, "length beyond input")
		return 0
	}
	return n
}

// SeqLen reads a sequence or map count bounded by max, and rejects early a
// count whose elements (each at least minElem bytes) cannot fit in the
// remaining input, with CodeUnexpectedEnd.
//
// That early rejection does not match Rust's error order: postcard decodes
// elements lazily, so an invalid element before the end of the input is
// reported as that element's error (an unknown enum variant is SerdeDeCustom,
// not DeserializeUnexpectedEnd). Decode sequences with Len, SeqCap and an
// element loop that stops at the first failure, as SeqCap's example shows
// (the wire message families do it through wire/internal/seq.Decode); SeqLen
// remains for callers that only need a count that fits the input.
func (d *Decoder) SeqLen(max, minElem int) int {
	start := d.off
	n := d.Len(max)
	if d.err == nil && minElem > 0 && n > (len(d.buf)-d.off)/minElem {
		d.failAt(CodeUnexpectedEnd, start, "count beyond input")
		return 0
	}
	return n
}

// SeqCap returns how many elements of a sequence whose declared count is n
// may be allocated up front: n, or, when the remaining input cannot hold n
// elements of at least minElem bytes each, the number it can hold. The
// allocation is thus bounded by the input actually received, never by the
// declared count. A minElem of 0 or less (zero-sized elements) gives n,
// which the caller has already bounded through Len.
//
// Rust's postcard decodes a sequence element by element, so when the input
// cannot hold the declared count, the error is that of the first element
// that fails: an invalid element before the end of the input reports its own
// error (an unknown enum variant is SerdeDeCustom), and only an element that
// runs out of input reports DeserializeUnexpectedEnd. To match it, decode the
// SeqCap elements, and when fewer than n were allocated decode one more
// element into a scratch value (it cannot fit, so it fails with Rust's
// error) and then Fail with CodeUnexpectedEnd (a no-op after that failure):
//
//	n := d.Len(MaxRefs)
//	m.Refs = postcard.Resize(m.Refs, d.SeqCap(n, refMinSize))
//	for i := range m.Refs {
//		m.Refs[i].DecodePostcard(d)
//	}
//	if len(m.Refs) < n {
//		var next Ref
//		next.DecodePostcard(d)
//		d.Fail(postcard.CodeUnexpectedEnd, "count beyond input")
//	}
//
// Element decoding is a no-op once the decoder has failed, so the loop stops
// costing anything at the first error.
func (d *Decoder) SeqCap(n, minElem int) int {
	if n <= 0 || d.err != nil {
		return 0
	}
	if minElem > 0 {
		if fit := d.Remaining() / minElem; fit < n {
			return fit
		}
	}
	return n
}

// Resize returns s with length n, reusing its capacity when it suffices and
// allocating exactly n elements otherwise; a nil s stays nil when n is 0.
// Reused elements keep their previous values: the element decoder must set
// every field. Size n with SeqCap, never with a declared count.
func Resize[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
}

// BytesRef reads bytes of at most max length and returns a slice aliasing the
// input (no copy, no allocation).
func (d *Decoder) BytesRef(max int) []byte {
	n := d.BytesLen(max)
	if d.err != nil {
		return nil
	}
	p := d.buf[d.off : d.off+n : d.off+n]
	d.off += n
	return p
}

// Bytes reads bytes of at most max length into a new slice (nil when empty).
func (d *Decoder) Bytes(max int) []byte {
	p := d.BytesRef(max)
	if len(p) == 0 {
		return nil
	}
	return append([]byte(nil), p...)
}

// String reads a UTF-8 string of at most max bytes.
func (d *Decoder) String(max int) string {
	start := d.off
	p := d.BytesRef(max)
	if d.err != nil {
		return ""
	}
	if !utf8.Valid(p) {
		d.failAt(CodeBadUTF8, start, "")
		return ""
	}
	return string(p)
}

// Variant reads an enum discriminant (u32 varint) and checks it is below n
// (CodeBadEnum otherwise).
func (d *Decoder) Variant(n uint32) uint32 {
	start := d.off
	v := d.U32()
	if d.err == nil && v >= n {
		d.failAt(CodeBadEnum, start, "")
		return 0
	}
	return v
}

// RawVariant reads an enum discriminant without a range check, for enums
// whose unknown variants the caller handles itself.
func (d *Decoder) RawVariant() uint32 { return d.U32() }

// Array16 reads 16 raw bytes into p (a fixed array such as a ULID).
func (d *Decoder) Array16(p *[16]byte) {
	if b := d.fixed(16, "[u8; 16]"); b != nil {
		copy(p[:], b)
	}
}

// Array32 reads 32 raw bytes into p (a fixed array such as a digest).
func (d *Decoder) Array32(p *[32]byte) {
	if b := d.fixed(32, "[u8; 32]"); b != nil {
		copy(p[:], b)
	}
}

// Fixed reads exactly len(p) raw bytes into p ([u8; N]).
func (d *Decoder) Fixed(p []byte) {
	if b := d.fixed(len(p), "[u8; N]"); b != nil {
		copy(p, b)
	}
}
