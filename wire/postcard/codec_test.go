package postcard_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math"
	"strings"
	"testing"
	"unicode/utf8"

	"forgeyard.dev/transport/wire/postcard"
)

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func wantCode(t *testing.T, err error, code postcard.Code) {
	t.Helper()
	var pe *postcard.Error
	if !errors.As(err, &pe) || pe.Code != code {
		t.Fatalf("err = %v, want code %v", err, code)
	}
}

func TestVarintBoundaries(t *testing.T) {
	cases := []struct {
		v   uint64
		hex string
	}{
		{0, "00"}, {1, "01"}, {127, "7f"}, {128, "8001"}, {16383, "ff7f"}, {16384, "808001"},
		{1<<21 - 1, "ffff7f"}, {1 << 21, "80808001"}, {1<<28 - 1, "ffffff7f"}, {1 << 28, "8080808001"},
		{math.MaxUint32, "ffffffff0f"}, {1<<35 - 1, "ffffffff7f"}, {1 << 35, "808080808001"},
		{1<<63 - 1, "ffffffffffffffff7f"}, {1 << 63, "80808080808080808001"},
		{math.MaxUint64, "ffffffffffffffffff01"},
	}
	for _, c := range cases {
		want := mustHex(t, c.hex)
		got := postcard.AppendU64(nil, c.v)
		if !bytes.Equal(got, want) {
			t.Errorf("AppendU64(%d) = %x, want %x", c.v, got, want)
		}
		if n := postcard.UvarintLen(c.v); n != len(want) {
			t.Errorf("UvarintLen(%d) = %d, want %d", c.v, n, len(want))
		}
		d := postcard.NewDecoder(want)
		if v := d.U64(); v != c.v || d.Finish() != nil {
			t.Errorf("U64(%x) = %d, %v", want, v, d.Err())
		}
	}
	// Width limits of the narrower varints.
	for _, c := range []struct {
		hex  string
		read func(*postcard.Decoder) uint64
		want uint64
		code postcard.Code
	}{
		{"ffff03", func(d *postcard.Decoder) uint64 { return uint64(d.U16()) }, math.MaxUint16, 0},
		{"808004", func(d *postcard.Decoder) uint64 { return uint64(d.U16()) }, 0, postcard.CodeBadVarint},
		{"ffffffff0f", func(d *postcard.Decoder) uint64 { return uint64(d.U32()) }, math.MaxUint32, 0},
		{"ffffffff1f", func(d *postcard.Decoder) uint64 { return uint64(d.U32()) }, 0, postcard.CodeBadVarint},
		{"ffffffffffffffffff02", func(d *postcard.Decoder) uint64 { return d.U64() }, 0, postcard.CodeBadVarint},
		{"80808080808080808080", func(d *postcard.Decoder) uint64 { return d.U64() }, 0, postcard.CodeBadVarint},
		{"8080", func(d *postcard.Decoder) uint64 { return d.U64() }, 0, postcard.CodeUnexpectedEnd},
		{"", func(d *postcard.Decoder) uint64 { return uint64(d.U32()) }, 0, postcard.CodeUnexpectedEnd},
	} {
		d := postcard.NewDecoder(mustHex(t, c.hex))
		got := c.read(&d)
		if c.code == 0 {
			if got != c.want || d.Finish() != nil {
				t.Errorf("%s: got %d, %v; want %d", c.hex, got, d.Err(), c.want)
			}
			continue
		}
		if got != 0 {
			t.Errorf("%s: failed read returned %d, want 0", c.hex, got)
		}
		wantCode(t, d.Err(), c.code)
	}
}

func TestZigzag(t *testing.T) {
	for _, c := range []struct {
		v   int64
		hex string
	}{
		{0, "00"}, {-1, "01"}, {1, "02"}, {-2, "03"}, {63, "7e"}, {-64, "7f"}, {64, "8001"}, {-65, "8101"},
		{math.MaxInt64, "feffffffffffffffff01"}, {math.MinInt64, "ffffffffffffffffff01"},
	} {
		got := postcard.AppendI64(nil, c.v)
		if hex.EncodeToString(got) != c.hex {
			t.Errorf("AppendI64(%d) = %x, want %s", c.v, got, c.hex)
		}
		d := postcard.NewDecoder(got)
		if v := d.I64(); v != c.v || d.Finish() != nil {
			t.Errorf("I64(%x) = %d, %v", got, v, d.Err())
		}
	}
	for _, v := range []int16{0, -1, 1, 64, -65, math.MaxInt16, math.MinInt16} {
		d := postcard.NewDecoder(postcard.AppendI16(nil, v))
		if got := d.I16(); got != v || d.Finish() != nil {
			t.Errorf("I16 round trip %d = %d, %v", v, got, d.Err())
		}
	}
	if got := hex.EncodeToString(postcard.AppendI16(nil, math.MinInt16)); got != "ffff03" {
		t.Errorf("AppendI16(min) = %s", got)
	}
	for _, v := range []int32{0, -1, 1, math.MaxInt32, math.MinInt32} {
		d := postcard.NewDecoder(postcard.AppendI32(nil, v))
		if got := d.I32(); got != v || d.Finish() != nil {
			t.Errorf("I32 round trip %d = %d, %v", v, got, d.Err())
		}
	}
	if got := hex.EncodeToString(postcard.AppendI32(nil, math.MinInt32)); got != "ffffffff0f" {
		t.Errorf("AppendI32(min) = %s", got)
	}
	for _, v := range []int8{0, -1, 127, -128} {
		b := postcard.AppendI8(nil, v)
		d := postcard.NewDecoder(b)
		if len(b) != 1 || d.I8() != v {
			t.Errorf("I8 %d encoded as %x", v, b)
		}
	}
}

func Test128(t *testing.T) {
	max := postcard.U128{Hi: math.MaxUint64, Lo: math.MaxUint64}
	for _, c := range []struct {
		v   postcard.U128
		hex string
	}{
		{postcard.U128{}, "00"},
		{postcard.U128{Lo: 128}, "8001"},
		{postcard.U128{Lo: math.MaxUint64}, "ffffffffffffffffff01"},
		{postcard.U128{Hi: 1}, "80808080808080808002"},
		{max, "ffffffffffffffffffffffffffffffffffff03"},
	} {
		got := postcard.AppendU128(nil, c.v)
		if hex.EncodeToString(got) != c.hex {
			t.Errorf("AppendU128(%+v) = %x, want %s", c.v, got, c.hex)
		}
		d := postcard.NewDecoder(got)
		if v := d.U128(); v != c.v || d.Finish() != nil {
			t.Errorf("U128(%x) = %+v, %v", got, v, d.Err())
		}
	}
	// i128: -1 is all ones in two's complement and zigzags to 1.
	minusOne := max
	minI := postcard.U128{Hi: 1 << 63}
	maxI := postcard.U128{Hi: 1<<63 - 1, Lo: math.MaxUint64}
	for _, c := range []struct {
		v   postcard.U128
		hex string
	}{
		{postcard.U128{}, "00"}, {minusOne, "01"}, {postcard.U128{Lo: 1}, "02"},
		{minI, "ffffffffffffffffffffffffffffffffffff03"},
		{maxI, "feffffffffffffffffffffffffffffffffff03"},
	} {
		got := postcard.AppendI128(nil, c.v)
		if hex.EncodeToString(got) != c.hex {
			t.Errorf("AppendI128(%+v) = %x, want %s", c.v, got, c.hex)
		}
		d := postcard.NewDecoder(got)
		if v := d.I128(); v != c.v || d.Finish() != nil {
			t.Errorf("I128(%x) = %+v, %v", got, v, d.Err())
		}
	}
	for _, bad := range []string{"ffffffffffffffffffffffffffffffffffff04", "8080808080808080808080808080808080808000"} {
		d := postcard.NewDecoder(mustHex(t, bad))
		if v := d.U128(); v != (postcard.U128{}) {
			t.Errorf("%s: returned %+v", bad, v)
		}
		wantCode(t, d.Err(), postcard.CodeBadVarint)
	}
	d := postcard.NewDecoder(mustHex(t, "ffff"))
	d.U128()
	wantCode(t, d.Err(), postcard.CodeUnexpectedEnd)
}

func TestFloats(t *testing.T) {
	f32s := []uint32{0x00000000, 0x80000000, 0x3f800000, 0x7f800000, 0xff800000, 0x7fc00000,
		0x7fa00001 /* signalling NaN with payload */, 0xffc12345, 0x00000001}
	for _, bits := range f32s {
		b := postcard.AppendF32(nil, math.Float32frombits(bits))
		if len(b) != 4 || b[0] != byte(bits) || b[3] != byte(bits>>24) {
			t.Errorf("AppendF32(%08x) = %x, want little-endian bits", bits, b)
		}
		d := postcard.NewDecoder(b)
		if got := math.Float32bits(d.F32()); got != bits || d.Finish() != nil {
			t.Errorf("F32 %08x decoded as %08x (%v)", bits, got, d.Err())
		}
	}
	f64s := []uint64{0, 1 << 63, 0x3ff0000000000000, 0x7ff0000000000000, 0x7ff8000000000000,
		0x7ff0000000000001 /* signalling NaN */, 0xfff8dead0000beef, 1}
	for _, bits := range f64s {
		b := postcard.AppendF64(nil, math.Float64frombits(bits))
		if len(b) != 8 || b[0] != byte(bits) || b[7] != byte(bits>>56) {
			t.Errorf("AppendF64(%016x) = %x", bits, b)
		}
		d := postcard.NewDecoder(b)
		if got := math.Float64bits(d.F64()); got != bits || d.Finish() != nil {
			t.Errorf("F64 %016x decoded as %016x (%v)", bits, got, d.Err())
		}
	}
	if got := hex.EncodeToString(postcard.AppendF32(nil, 1)); got != "0000803f" {
		t.Errorf("f32 1.0 = %s", got)
	}
	if got := hex.EncodeToString(postcard.AppendF64(nil, 1)); got != "000000000000f03f" {
		t.Errorf("f64 1.0 = %s", got)
	}
	d := postcard.NewDecoder(mustHex(t, "00803f"))
	d.F32()
	wantCode(t, d.Err(), postcard.CodeUnexpectedEnd)
}

func TestChars(t *testing.T) {
	for _, c := range []struct {
		r   rune
		hex string
	}{
		{'a', "0161"}, {'é', "02c3a9"}, {'€', "03e282ac"}, {'😀', "04f09f9880"}, {0x10ffff, "04f48fbfbf"}, {0, "0100"},
	} {
		b := postcard.AppendChar(nil, c.r)
		if hex.EncodeToString(b) != c.hex {
			t.Errorf("AppendChar(%U) = %x, want %s", c.r, b, c.hex)
		}
		d := postcard.NewDecoder(b)
		if r := d.Char(); r != c.r || d.Finish() != nil {
			t.Errorf("Char(%x) = %U, %v", b, r, d.Err())
		}
	}
	// Invalid runes are encoded as U+FFFD.
	for _, r := range []rune{-1, 0xd800, 0x110000} {
		if got := postcard.AppendChar(nil, r); !bytes.Equal(got, postcard.AppendChar(nil, utf8.RuneError)) {
			t.Errorf("AppendChar(%#x) = %x, want U+FFFD", r, got)
		}
	}
	for _, c := range []struct {
		hex  string
		code postcard.Code
	}{
		{"00", postcard.CodeBadChar}, {"056161616161", postcard.CodeBadChar}, {"01ff", postcard.CodeBadChar},
		{"03eda080", postcard.CodeBadChar}, {"0261", postcard.CodeUnexpectedEnd}, {"", postcard.CodeUnexpectedEnd},
		{"ffffffffffffffffff02", postcard.CodeBadVarint},
	} {
		d := postcard.NewDecoder(mustHex(t, c.hex))
		if r := d.Char(); r != 0 {
			t.Errorf("%s: returned %U", c.hex, r)
		}
		wantCode(t, d.Err(), c.code)
	}
	// Rust compatibility: a payload with two chars yields the first.
	d := postcard.NewDecoder(mustHex(t, "026162"))
	if r := d.Char(); r != 'a' || d.Finish() != nil {
		t.Errorf("two-char payload = %U, %v", r, d.Err())
	}
}

func TestStringsAndBytes(t *testing.T) {
	long := string(bytes.Repeat([]byte("é"), 100))
	b := postcard.AppendString(nil, long)
	if hex.EncodeToString(b[:2]) != "c801" || len(b) != 202 {
		t.Fatalf("100×é encoded with prefix %x, len %d", b[:2], len(b))
	}
	d := postcard.NewDecoder(b)
	if s := d.String(200); s != long || d.Finish() != nil {
		t.Fatalf("String round trip: %v", d.Err())
	}
	d = postcard.NewDecoder(b)
	if s := d.String(199); s != "" {
		t.Fatalf("over-bound string returned %q", s)
	}
	wantCode(t, d.Err(), postcard.CodeLengthOverBound)

	p := []byte{1, 2, 3}
	enc := postcard.AppendBytes(nil, p)
	d = postcard.NewDecoder(enc)
	ref := d.BytesRef(3)
	if !bytes.Equal(ref, p) || &ref[0] != &enc[1] || cap(ref) != 3 {
		t.Fatalf("BytesRef = %x (must alias the input with capped capacity)", ref)
	}
	d = postcard.NewDecoder(enc)
	cp := d.Bytes(3)
	if !bytes.Equal(cp, p) || &cp[0] == &enc[1] {
		t.Fatalf("Bytes must copy")
	}
	d = postcard.NewDecoder([]byte{0})
	if d.Bytes(8) != nil || d.Finish() != nil {
		t.Fatalf("empty Bytes must be nil")
	}
	d = postcard.NewDecoder(mustHex(t, "02c328"))
	d.String(10)
	wantCode(t, d.Err(), postcard.CodeBadUTF8)
}

func TestBounds(t *testing.T) {
	// Len: over the bound.
	d := postcard.NewDecoder(postcard.AppendLen(nil, 1001))
	if n := d.Len(1000); n != 0 {
		t.Fatalf("Len over bound returned %d", n)
	}
	wantCode(t, d.Err(), postcard.CodeLengthOverBound)
	if !errors.Is(d.Err(), postcard.ErrLengthOverBound) {
		t.Fatal("errors.Is(ErrLengthOverBound) failed")
	}
	// Len does not look at the remaining input.
	d = postcard.NewDecoder(postcard.AppendLen(nil, 1000))
	if n := d.Len(1000); n != 1000 || d.Err() != nil {
		t.Fatalf("Len(1000) = %d, %v", n, d.Err())
	}
	// BytesLen: over the bound, and within the bound but beyond input.
	d = postcard.NewDecoder(postcard.AppendLen(nil, 65))
	d.BytesLen(64)
	wantCode(t, d.Err(), postcard.CodeLengthOverBound)
	d = postcard.NewDecoder(append(postcard.AppendLen(nil, 5), 1, 2, 3, 4))
	if n := d.BytesLen(64); n != 0 {
		t.Fatalf("BytesLen beyond input returned %d", n)
	}
	wantCode(t, d.Err(), postcard.CodeUnexpectedEnd)
	// A huge declared length (u64::MAX) is refused, never allocated.
	d = postcard.NewDecoder(mustHex(t, "ffffffffffffffffff01"))
	if b := d.Bytes(math.MaxInt); b != nil {
		t.Fatal("huge length returned bytes")
	}
	wantCode(t, d.Err(), postcard.CodeLengthOverBound)
	// SeqLen: over the bound; count × minElem beyond input; minElem 0.
	d = postcard.NewDecoder(postcard.AppendLen(nil, 257))
	d.SeqLen(256, 1)
	wantCode(t, d.Err(), postcard.CodeLengthOverBound)
	d = postcard.NewDecoder(append(postcard.AppendLen(nil, 3), make([]byte, 3*34-1)...))
	if n := d.SeqLen(256, 34); n != 0 {
		t.Fatalf("SeqLen beyond input returned %d", n)
	}
	wantCode(t, d.Err(), postcard.CodeUnexpectedEnd)
	d = postcard.NewDecoder(append(postcard.AppendLen(nil, 3), make([]byte, 3*34)...))
	if n := d.SeqLen(256, 34); n != 3 || d.Err() != nil {
		t.Fatalf("SeqLen exact fit = %d, %v", n, d.Err())
	}
	d = postcard.NewDecoder(postcard.AppendLen(nil, 200))
	if n := d.SeqLen(256, 0); n != 200 || d.Err() != nil {
		t.Fatalf("SeqLen(minElem 0) = %d, %v", n, d.Err())
	}
	// Variant range.
	d = postcard.NewDecoder([]byte{3})
	if v := d.Variant(3); v != 0 {
		t.Fatalf("Variant out of range returned %d", v)
	}
	wantCode(t, d.Err(), postcard.CodeBadEnum)
	if postcard.CodeBadEnum.RustName() != "SerdeDeCustom" {
		t.Fatal("CodeBadEnum must map to SerdeDeCustom")
	}
	d = postcard.NewDecoder([]byte{0x81, 0x00})
	if v := d.RawVariant(); v != 1 || d.Finish() != nil {
		t.Fatalf("RawVariant = %d, %v", v, d.Err())
	}
	// Fixed arrays.
	var a16 [16]byte
	var a32 [32]byte
	d = postcard.NewDecoder(make([]byte, 15))
	d.Array16(&a16)
	wantCode(t, d.Err(), postcard.CodeUnexpectedEnd)
	src := make([]byte, 48)
	for i := range src {
		src[i] = byte(i)
	}
	d = postcard.NewDecoder(src)
	d.Array16(&a16)
	d.Array32(&a32)
	if d.Finish() != nil || a16[15] != 15 || a32[0] != 16 || a32[31] != 47 {
		t.Fatalf("arrays: %x %x %v", a16, a32, d.Err())
	}
	var f [3]byte
	d = postcard.NewDecoder([]byte{7, 8, 9})
	d.Fixed(f[:])
	if f != [3]byte{7, 8, 9} || d.Finish() != nil {
		t.Fatalf("Fixed = %x", f)
	}
}

func TestBoolOption(t *testing.T) {
	for i, want := range []bool{false, true} {
		d := postcard.NewDecoder([]byte{byte(i)})
		if d.Bool() != want || d.Finish() != nil {
			t.Fatalf("Bool(%d)", i)
		}
		d = postcard.NewDecoder([]byte{byte(i)})
		if d.Option() != want || d.Finish() != nil {
			t.Fatalf("Option(%d)", i)
		}
		if got := postcard.AppendBool(nil, want); !bytes.Equal(got, []byte{byte(i)}) {
			t.Fatalf("AppendBool(%v) = %x", want, got)
		}
		if got := postcard.AppendOption(nil, want); !bytes.Equal(got, []byte{byte(i)}) {
			t.Fatalf("AppendOption(%v) = %x", want, got)
		}
	}
	d := postcard.NewDecoder([]byte{2})
	if d.Bool() {
		t.Fatal("bad bool returned true")
	}
	wantCode(t, d.Err(), postcard.CodeBadBool)
	d = postcard.NewDecoder([]byte{0xff})
	if d.Option() {
		t.Fatal("bad option returned true")
	}
	wantCode(t, d.Err(), postcard.CodeBadOption)
}

func TestStickyErrors(t *testing.T) {
	in := append([]byte{0x02}, postcard.AppendU64(nil, 300)...) // bad bool, then a valid u64
	in = postcard.AppendString(in, "hi")
	d := postcard.NewDecoder(in)
	d.Bool()
	first := d.Err()
	wantCode(t, first, postcard.CodeBadBool)
	off := d.Offset()
	if v := d.U64(); v != 0 {
		t.Fatalf("read after failure returned %d", v)
	}
	if s := d.String(10); s != "" {
		t.Fatalf("String after failure returned %q", s)
	}
	if d.U8() != 0 || d.U16() != 0 || d.U32() != 0 || d.I64() != 0 || d.F64() != 0 || d.Char() != 0 ||
		d.BytesRef(10) != nil || d.Bool() || d.Option() || d.Variant(10) != 0 || d.Len(10) != 0 ||
		d.U128() != (postcard.U128{}) || d.I128() != (postcard.U128{}) {
		t.Fatal("reads after failure must return zero values")
	}
	d.Fail(postcard.CodeInvalidValue, "later")
	if d.Err() != first || d.Offset() != off || !d.Failed() {
		t.Fatalf("error not sticky: %v (first %v), offset %d→%d", d.Err(), first, off, d.Offset())
	}
	if d.Finish() != first {
		t.Fatal("Finish must return the first error")
	}
	var pe *postcard.Error
	if !errors.As(first, &pe) || pe.Offset != 0 {
		t.Fatalf("first error offset: %v", first)
	}
	// Fail records a validation error at the current offset.
	d = postcard.NewDecoder([]byte{1, 2})
	d.U8()
	d.Fail(postcard.CodeInvalidValue, "field")
	if !errors.Is(d.Err(), postcard.ErrInvalidValue) || d.Err().Error() != "postcard: invalid value (field) at offset 1" {
		t.Fatalf("Fail: %v", d.Err())
	}
	// Reset clears the error.
	d.Reset([]byte{5})
	if d.Err() != nil || d.U8() != 5 || d.Finish() != nil {
		t.Fatal("Reset did not clear the decoder")
	}
}

func TestFinishTrailing(t *testing.T) {
	d := postcard.NewDecoder([]byte{1, 2, 3})
	d.U8()
	if d.Remaining() != 2 || !bytes.Equal(d.Rest(), []byte{2, 3}) {
		t.Fatalf("Remaining %d Rest %x", d.Remaining(), d.Rest())
	}
	err := d.Finish()
	wantCode(t, err, postcard.CodeTrailingBytes)
	if !errors.Is(err, postcard.ErrTrailingBytes) || postcard.CodeTrailingBytes.RustName() != "" {
		t.Fatal("trailing bytes: no Rust counterpart expected")
	}
	var zero postcard.Decoder
	if zero.Finish() != nil || zero.Remaining() != 0 {
		t.Fatal("zero Decoder must decode an empty input")
	}
	zero.U8()
	wantCode(t, zero.Err(), postcard.CodeUnexpectedEnd)
}

func TestCodeNames(t *testing.T) {
	want := map[postcard.Code]string{
		postcard.CodeUnexpectedEnd: "DeserializeUnexpectedEnd", postcard.CodeBadVarint: "DeserializeBadVarint",
		postcard.CodeBadBool: "DeserializeBadBool", postcard.CodeBadOption: "DeserializeBadOption",
		postcard.CodeBadUTF8: "DeserializeBadUtf8", postcard.CodeBadChar: "DeserializeBadChar",
		postcard.CodeBadEnum: "SerdeDeCustom", postcard.CodeInvalidValue: "SerdeDeCustom",
		postcard.CodeLengthOverBound: "", postcard.CodeTrailingBytes: "",
	}
	for c, n := range want {
		if c.RustName() != n {
			t.Errorf("%d.RustName() = %q, want %q", c, c.RustName(), n)
		}
		if strings.HasPrefix(c.String(), "postcard code") {
			t.Errorf("code %d has no name", c)
		}
	}
	// The numbers are part of the contract.
	if postcard.CodeUnexpectedEnd != 1 || postcard.CodeInvalidValue != 10 || postcard.Code(99).String() != "postcard code 99" {
		t.Fatal("code numbering changed")
	}
}

// appendAll appends one of every kind; its allocations are measured.
func appendAll(b []byte) []byte {
	b = postcard.AppendU8(b, 1)
	b = postcard.AppendI8(b, -1)
	b = postcard.AppendBool(b, true)
	b = postcard.AppendU16(b, 65535)
	b = postcard.AppendU32(b, 1<<31)
	b = postcard.AppendU64(b, math.MaxUint64)
	b = postcard.AppendU128(b, postcard.U128{Hi: 7, Lo: 9})
	b = postcard.AppendI16(b, -300)
	b = postcard.AppendI32(b, -70000)
	b = postcard.AppendI64(b, math.MinInt64)
	b = postcard.AppendI128(b, postcard.U128{Hi: math.MaxUint64, Lo: 5})
	b = postcard.AppendF32(b, 1.5)
	b = postcard.AppendF64(b, -2.25)
	b = postcard.AppendChar(b, '€')
	b = postcard.AppendString(b, "hello, postcard")
	b = postcard.AppendBytes(b, allocPayload[:])
	b = postcard.AppendOption(b, false)
	b = postcard.AppendLen(b, 1000)
	b = postcard.AppendVariant(b, 129)
	b = postcard.AppendUvarint(b, 1<<40)
	return b
}

var allocPayload [64]byte

func TestAllocs(t *testing.T) {
	buf := make([]byte, 0, 512)
	if n := testing.AllocsPerRun(100, func() { buf = appendAll(buf[:0]) }); n != 0 {
		t.Errorf("Append* into a pre-sized buffer: %v allocs/run, want 0", n)
	}
	enc := appendAll(nil)
	var sink uint64
	n := testing.AllocsPerRun(100, func() {
		d := postcard.NewDecoder(enc)
		sink += uint64(d.U8())
		sink += uint64(d.I8())
		if d.Bool() {
			sink++
		}
		sink += uint64(d.U16()) + uint64(d.U32()) + d.U64() + d.U128().Lo
		sink += uint64(d.I16()) + uint64(d.I32()) + uint64(d.I64()) + d.I128().Hi
		sink += uint64(d.F32()) + uint64(d.F64())
		sink += uint64(d.Char())
		sink += uint64(len(d.BytesRef(64))) // the string, as bytes
		sink += uint64(len(d.BytesRef(64)))
		if d.Option() {
			sink++
		}
		sink += uint64(d.Len(1000)) + uint64(d.Variant(200)) + d.U64()
		if d.Finish() != nil {
			panic(d.Err())
		}
	})
	if n != 0 {
		t.Errorf("decoding scalars and BytesRef: %v allocs/run, want 0", n)
	}
	// Failure paths allocate one *Error at most.
	bad := []byte{0xff}
	if n := testing.AllocsPerRun(100, func() { d := postcard.NewDecoder(bad); d.Bool(); d.U64() }); n > 1 {
		t.Errorf("a failed decode allocates %v times, want ≤ 1", n)
	}
	_ = sink
}

// FuzzDecoder drives arbitrary bytes through a sequence of reads chosen by
// the first byte (and by the bytes themselves). It must never panic, never
// read past the input, and keep errors sticky.
func FuzzDecoder(f *testing.F) {
	for _, s := range []string{"", "00", "ff8001", "0a0568656c6c6f", "17ffffffffffffffffff01", "33026162",
		"42808004", "5affffffffffffffffffffffffffffffffffff03", "6101ff"} {
		f.Add(mustHex(f, s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 {
			var d postcard.Decoder
			d.U8()
			if d.Err() == nil {
				t.Fatal("read from empty input succeeded")
			}
			return
		}
		sel := in[0]
		d := postcard.NewDecoder(in[1:])
		var firstErr error
		for step := 0; step < 64; step++ {
			op := (int(sel) + step*7) % 22
			before := d.Offset()
			switch op {
			case 0:
				d.U8()
			case 1:
				d.Bool()
			case 2:
				d.Option()
			case 3:
				d.U16()
			case 4:
				d.U32()
			case 5:
				d.U64()
			case 6:
				d.U128()
			case 7:
				d.I16()
			case 8:
				d.I32()
			case 9:
				d.I64()
			case 10:
				d.I128()
			case 11:
				d.F32()
			case 12:
				d.F64()
			case 13:
				if r := d.Char(); r != 0 && !utf8.ValidRune(r) {
					t.Fatalf("Char returned invalid rune %U", r)
				}
			case 14:
				if s := d.String(32); !utf8.ValidString(s) || len(s) > 32 {
					t.Fatalf("String returned %q", s)
				}
			case 15:
				if p := d.BytesRef(16); len(p) > 16 {
					t.Fatalf("BytesRef over bound: %d", len(p))
				}
			case 16:
				if n := d.SeqLen(100, 3); n > 100 || (n > 0 && n*3 > d.Remaining()) {
					t.Fatalf("SeqLen = %d with %d remaining", n, d.Remaining())
				}
			case 17:
				if v := d.Variant(5); v >= 5 {
					t.Fatalf("Variant = %d", v)
				}
			case 18:
				var a [16]byte
				d.Array16(&a)
			case 19:
				var a [32]byte
				d.Array32(&a)
			case 20:
				if n := d.BytesLen(8); n > 8 || n > d.Remaining() {
					t.Fatalf("BytesLen = %d", n)
				}
			case 21:
				if b := d.Bytes(16); len(b) > 16 {
					t.Fatalf("Bytes over bound")
				}
			}
			if d.Offset() < before || d.Offset() > len(in)-1 {
				t.Fatalf("offset moved from %d to %d (input %d)", before, d.Offset(), len(in)-1)
			}
			if firstErr != nil {
				if d.Err() != firstErr || d.Offset() != before {
					t.Fatal("error not sticky")
				}
			} else if d.Err() != nil {
				firstErr = d.Err()
			}
		}
		_ = d.Finish()
	})
}

// FuzzRoundTrip checks that varints, zigzag integers and strings survive a
// round trip and that decoding consumes exactly what encoding wrote.
func FuzzRoundTrip(f *testing.F) {
	f.Add(uint64(0), int64(0), "")
	f.Add(uint64(math.MaxUint64), int64(math.MinInt64), "é€😀")
	f.Add(uint64(128), int64(-65), "\xff")
	f.Fuzz(func(t *testing.T, u uint64, i int64, s string) {
		b := postcard.AppendU64(nil, u)
		if len(b) != postcard.UvarintLen(u) {
			t.Fatalf("UvarintLen(%d) = %d, wrote %d", u, postcard.UvarintLen(u), len(b))
		}
		b = postcard.AppendI64(b, i)
		b = postcard.AppendU32(b, uint32(u))
		b = postcard.AppendI32(b, int32(i))
		b = postcard.AppendU16(b, uint16(u))
		b = postcard.AppendI16(b, int16(i))
		b = postcard.AppendU128(b, postcard.U128{Hi: u, Lo: uint64(i)})
		b = postcard.AppendI128(b, postcard.U128{Hi: uint64(i), Lo: u})
		b = postcard.AppendString(b, s)
		b = postcard.AppendBytes(b, []byte(s))
		d := postcard.NewDecoder(b)
		if got := d.U64(); got != u {
			t.Fatalf("U64 %d → %d", u, got)
		}
		if got := d.I64(); got != i {
			t.Fatalf("I64 %d → %d", i, got)
		}
		if got := d.U32(); got != uint32(u) {
			t.Fatalf("U32")
		}
		if got := d.I32(); got != int32(i) {
			t.Fatalf("I32")
		}
		if got := d.U16(); got != uint16(u) {
			t.Fatalf("U16")
		}
		if got := d.I16(); got != int16(i) {
			t.Fatalf("I16")
		}
		if got := d.U128(); got != (postcard.U128{Hi: u, Lo: uint64(i)}) {
			t.Fatalf("U128 %+v", got)
		}
		if got := d.I128(); got != (postcard.U128{Hi: uint64(i), Lo: u}) {
			t.Fatalf("I128 %+v", got)
		}
		got := d.String(len(s))
		if utf8.ValidString(s) {
			if got != s {
				t.Fatalf("String %q → %q (%v)", s, got, d.Err())
			}
		} else {
			// Invalid UTF-8 is refused on decode, never passed through.
			wantCode(t, d.Err(), postcard.CodeBadUTF8)
			return
		}
		if p := d.BytesRef(len(s)); string(p) != s {
			t.Fatalf("Bytes %q → %q", s, p)
		}
		if err := d.Finish(); err != nil {
			t.Fatal(err)
		}
		// Every strict prefix is reported as truncated.
		for n := 0; n < len(b); n += 1 + len(b)/16 {
			d := postcard.NewDecoder(b[:n])
			d.U64()
			d.I64()
			d.U32()
			d.I32()
			d.U16()
			d.I16()
			d.U128()
			d.I128()
			d.String(len(s))
			d.BytesRef(len(s))
			if !errors.Is(d.Err(), postcard.ErrUnexpectedEnd) {
				t.Fatalf("prefix %d/%d: %v", n, len(b), d.Err())
			}
		}
	})
}

// TestNegativeBound: a negative bound accepts only length 0; it must not
// wrap to "no bound" (which let u64::MAX through as a negative int).
func TestNegativeBound(t *testing.T) {
	huge := mustHex(t, "ffffffffffffffffff01")
	for name, read := range map[string]func(*postcard.Decoder){
		"Len":      func(d *postcard.Decoder) { d.Len(-1) },
		"BytesLen": func(d *postcard.Decoder) { d.BytesLen(-1) },
		"SeqLen":   func(d *postcard.Decoder) { d.SeqLen(-1, 0) },
		"BytesRef": func(d *postcard.Decoder) { d.BytesRef(-1) },
		"Bytes":    func(d *postcard.Decoder) { d.Bytes(-1) },
		"String":   func(d *postcard.Decoder) { d.String(-1) },
	} {
		d := postcard.NewDecoder(huge)
		read(&d)
		wantCode(t, d.Err(), postcard.CodeLengthOverBound)
		d = postcard.NewDecoder([]byte{0})
		read(&d)
		if d.Finish() != nil {
			t.Errorf("%s(-1) of length 0: %v", name, d.Err())
		}
	}
}
