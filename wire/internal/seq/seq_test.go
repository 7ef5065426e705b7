package seq

import (
	"errors"
	"slices"
	"testing"

	"forgeyard.dev/transport/wire/postcard"
)

func appendU32(v *uint32, b []byte) []byte { return postcard.AppendU32(b, *v) }

func decodeU32s(d *postcard.Decoder, s []uint32, max int) []uint32 {
	for v := range Decode(d, &s, max, 1) {
		*v = d.U32()
	}
	return s
}

func TestRoundTripReusesCapacity(t *testing.T) {
	in := []uint32{1, 300, 70000}
	b := Append(nil, in, appendU32)
	if want := []byte{3, 1, 0xac, 0x02, 0xf0, 0xa2, 0x04}; !slices.Equal(b, want) {
		t.Fatalf("encoded % x, want % x", b, want)
	}
	dst := make([]uint32, 0, 8)
	d := postcard.NewDecoder(b)
	got := decodeU32s(&d, dst, 8)
	if err := d.Finish(); err != nil || !slices.Equal(got, in) || &got[0] != &dst[:1][0] {
		t.Fatalf("decoded %v (%v), reused=%v", got, err, &got[0] == &dst[:1][0])
	}
	if n := testing.AllocsPerRun(20, func() {
		d := postcard.NewDecoder(b)
		got = decodeU32s(&d, got, 8)
	}); n != 0 {
		t.Fatalf("decoding into a reused slice allocated %.1f times", n)
	}
}

func TestDecodeErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		max  int
		want error
	}{
		{"over bound", []byte{3, 1, 2, 3}, 2, postcard.ErrLengthOverBound},
		// the count needs more elements than the input holds: the first one
		// that runs out reports its own error, then UnexpectedEnd stays
		{"count beyond input", []byte{3, 1, 2}, 8, postcard.ErrUnexpectedEnd},
		// a count beyond the input whose first element is bad before the
		// end reports that element's error, as Rust does
		{"bad element first", []byte{0xc8, 0x01, 0xff, 0xff, 0xff, 0xff, 0x7f}, 255, postcard.ErrBadVarint},
	} {
		d := postcard.NewDecoder(tc.in)
		decodeU32s(&d, nil, tc.max)
		if err := d.Err(); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestBytes(t *testing.T) {
	in := [][]byte{{1, 2}, {3}}
	b := AppendBytes(nil, in)
	d := postcard.NewDecoder(b)
	got := DecodeBytes(&d, 4, 2)
	if err := d.Finish(); err != nil || len(got) != 2 || !slices.Equal(got[0], in[0]) || !slices.Equal(got[1], in[1]) {
		t.Fatalf("decoded %v (%v)", got, err)
	}
	if &got[0][0] == &b[2] {
		t.Fatal("decoded bytes alias the input")
	}
	d = postcard.NewDecoder([]byte{0})
	if got := DecodeBytes(&d, 4, 2); got != nil || d.Finish() != nil {
		t.Fatalf("empty list decoded as %#v (%v)", got, d.Err())
	}
}
