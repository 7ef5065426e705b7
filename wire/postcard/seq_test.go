package postcard_test

import (
	"errors"
	"testing"

	"forgeyard.dev/transport/wire/postcard"
)

// seqItem is a test element: struct Item { id: u8, phase: AttemptPhase,
// name: String /* ≤ 8 */ }, at least 3 bytes.
type seqItem struct {
	ID    uint8
	Phase uint32
	Name  string
}

const (
	seqItemMin   = 3
	seqItemsMax  = 1 << 12
	seqNumPhases = 3
)

func (it *seqItem) decode(d *postcard.Decoder) {
	it.ID = d.U8()
	it.Phase = d.Variant(seqNumPhases)
	it.Name = d.String(8)
}

// decodeItems is the pattern the wire types use (see Decoder.SeqCap).
func decodeItems(d *postcard.Decoder, dst []seqItem) []seqItem {
	n := d.Len(seqItemsMax)
	dst = postcard.Resize(dst, d.SeqCap(n, seqItemMin))
	for i := range dst {
		dst[i].decode(d)
	}
	if len(dst) < n {
		var next seqItem
		next.decode(d)
		d.Fail(postcard.CodeUnexpectedEnd, "count beyond input")
	}
	return dst
}

// decodeItemsLazy is the reference: Rust postcard's order, one element at a
// time with no allocation bound at all.
func decodeItemsLazy(d *postcard.Decoder) []seqItem {
	n := d.Len(seqItemsMax)
	var out []seqItem
	for i := 0; i < n && !d.Failed(); i++ {
		var it seqItem
		it.decode(d)
		out = append(out, it)
	}
	return out
}

func TestSeqCap(t *testing.T) {
	d := postcard.NewDecoder(make([]byte, 10))
	for _, c := range []struct{ n, min, want int }{
		{0, 3, 0}, {-1, 3, 0}, {3, 3, 3}, {4, 3, 3}, {1000, 3, 3}, {1000, 1, 10},
		{1000, 11, 0}, {7, 0, 7}, {7, -1, 7}, {10, 1, 10},
	} {
		if got := d.SeqCap(c.n, c.min); got != c.want {
			t.Errorf("SeqCap(%d, %d) with 10 remaining = %d, want %d", c.n, c.min, got, c.want)
		}
	}
	d.Fail(postcard.CodeInvalidValue, "test")
	if got := d.SeqCap(5, 1); got != 0 {
		t.Errorf("SeqCap after a failure = %d, want 0", got)
	}
}

func TestResize(t *testing.T) {
	if s := postcard.Resize([]int(nil), 0); s != nil {
		t.Fatalf("Resize(nil, 0) = %v, want nil", s)
	}
	buf := make([]int, 2, 8)
	buf[1] = 7
	s := postcard.Resize(buf, 5)
	if len(s) != 5 || &s[0] != &buf[0] || s[1] != 7 {
		t.Fatalf("Resize did not reuse capacity: len %d", len(s))
	}
	if s := postcard.Resize(buf, 9); len(s) != 9 || cap(s) != 9 {
		t.Fatalf("Resize beyond capacity: len %d cap %d", len(s), cap(s))
	}
}

// TestSeqDecodeOrder: a sequence that declares more elements than the input
// holds reports the first element's own error, as Rust's postcard does, and
// unexpected end only where the input runs out.
func TestSeqDecodeOrder(t *testing.T) {
	for _, c := range []struct {
		name string
		hex  string
		code postcard.Code
		off  int
	}{
		// Vec<Item> declaring 5 elements; the 2nd element's phase is 7.
		{"second phase invalid, input ends after it", "05" + "010100" + "0207", postcard.CodeBadEnum, 5},
		{"second name bad UTF-8", "05" + "010100" + "020101ff", postcard.CodeBadUTF8, 6},
		{"second name over bound", "05" + "010100" + "020109", postcard.CodeLengthOverBound, 6},
		{"input ends inside the second", "05" + "010100" + "0201", postcard.CodeUnexpectedEnd, 6},
		{"input ends after the second", "05" + "010100" + "020200", postcard.CodeUnexpectedEnd, 7},
		{"nothing after the count", "05", postcard.CodeUnexpectedEnd, 1},
		{"count over the bound", "818001", postcard.CodeLengthOverBound, 0},
	} {
		in := mustHex(t, c.hex)
		d := postcard.NewDecoder(in)
		decodeItems(&d, nil)
		var pe *postcard.Error
		if !errors.As(d.Err(), &pe) || pe.Code != c.code || pe.Offset != c.off {
			t.Errorf("%s: %v, want %v at offset %d", c.name, d.Err(), c.code, c.off)
		}
	}
}

// TestSeqAllocationBounded: a hostile count allocates at most what the
// remaining input can hold, and nothing when nothing follows the count.
func TestSeqAllocationBounded(t *testing.T) {
	in := postcard.AppendLen(nil, seqItemsMax)
	var got []seqItem
	if n := testing.AllocsPerRun(20, func() {
		d := postcard.NewDecoder(in)
		got = decodeItems(&d, nil)
		if !errors.Is(d.Err(), postcard.ErrUnexpectedEnd) {
			t.Fatalf("err = %v", d.Err())
		}
	}); n > 1 || cap(got) != 0 {
		t.Fatalf("allocated %.1f times, cap %d", n, cap(got))
	}
	in = append(postcard.AppendLen(nil, seqItemsMax), make([]byte, 10*seqItemMin)...)
	d := postcard.NewDecoder(in)
	got = decodeItems(&d, nil)
	if cap(got) > 10 {
		t.Fatalf("cap %d for a count of %d with room for 10 elements", cap(got), seqItemsMax)
	}
}

// FuzzSeqDecode checks the bounded decoder against the unbounded lazy
// reference on arbitrary input: the same error (code and offset) or the same
// elements, and a slice capacity never above what the input after the count
// can hold (or the declared count when that is smaller).
func FuzzSeqDecode(f *testing.F) {
	for _, h := range []string{"00", "05", "050101000207", "02010100020200", "ffffffffffffffffff01", "8120", "0301010001020003"} {
		f.Add(mustHex(f, h))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		d := postcard.NewDecoder(in)
		got := decodeItems(&d, nil)
		ref := postcard.NewDecoder(in)
		want := decodeItemsLazy(&ref)
		if (d.Err() == nil) != (ref.Err() == nil) {
			t.Fatalf("%x: err %v, reference %v", in, d.Err(), ref.Err())
		}
		if d.Err() != nil {
			var a, b *postcard.Error
			errors.As(d.Err(), &a)
			errors.As(ref.Err(), &b)
			if a.Code != b.Code || a.Offset != b.Offset {
				t.Fatalf("%x: err %v, reference %v", in, d.Err(), ref.Err())
			}
		} else {
			if len(got) != len(want) || d.Offset() != ref.Offset() {
				t.Fatalf("%x: %d elements at offset %d, reference %d at %d", in, len(got), d.Offset(), len(want), ref.Offset())
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("%x: element %d = %+v, reference %+v", in, i, got[i], want[i])
				}
			}
		}
		// The allocation bound: the count's own bytes are at least 1.
		c := postcard.NewDecoder(in)
		n := c.Len(seqItemsMax)
		if c.Failed() {
			if cap(got) != 0 {
				t.Fatalf("%x: cap %d after a bad count", in, cap(got))
			}
			return
		}
		if limit := min(n, c.Remaining()/seqItemMin); cap(got) > limit {
			t.Fatalf("%x: cap %d above min(count %d, remaining %d / %d)", in, cap(got), n, c.Remaining(), seqItemMin)
		}
	})
}
