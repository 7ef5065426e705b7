package agent

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"forgeyard.dev/transport/wire/postcard"
)

// FuzzDecode decodes arbitrary bodies as every agent message type. The first
// input byte picks the type (index into Messages), the rest is the body. It
// is seeded with every sample.
//
// Invariants: decoding never panics and fails only with a *postcard.Error;
// no slice of the decoded value, complete or not, has a capacity above about
// the input's length (allocation is bounded by the input, not by counts);
// Validate never panics; whatever decodes re-encodes, and the re-encoding
// decodes to an equal value and re-encodes to the same bytes.
func FuzzDecode(f *testing.F) {
	index := map[uint16]byte{}
	for i, mi := range Messages {
		index[uint16(mi.Type)] = byte(i)
	}
	for _, m := range Samples() {
		f.Add(append([]byte{index[uint16(m.MessageType())]}, m.AppendPostcard(nil)...))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 {
			return
		}
		mi := &Messages[int(in[0])%len(Messages)]
		body := in[1:]
		if len(body) > mi.MaxSize {
			return // the registry refuses it before decoding
		}
		m := mi.New()
		d := postcard.NewDecoder(body)
		m.DecodePostcard(&d)
		// Pre-allocation is bounded by the input, whatever the declared
		// counts: every element and byte takes at least one byte of it
		// (doubled, plus 16, for append's rounding up to a size class).
		if p, ok := slicesWithin(reflect.ValueOf(m), 2*len(body)+16); !ok {
			t.Fatalf("%s: slice %s has a capacity above twice the %d-byte input", mi.Name, p, len(body))
		}
		if err := d.Finish(); err != nil {
			var pe *postcard.Error
			if !errors.As(err, &pe) {
				t.Fatalf("%s: untyped decode error %T %v", mi.Name, err, err)
			}
			return
		}
		_ = m.Validate()
		enc := m.AppendPostcard(nil)
		m2 := mi.New()
		d = postcard.NewDecoder(enc)
		m2.DecodePostcard(&d)
		if err := d.Finish(); err != nil {
			t.Fatalf("%s: re-encoding does not decode: %v\n%x", mi.Name, err, enc)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("%s: round trip changed the value:\n%#v\n%#v", mi.Name, m, m2)
		}
		if enc2 := m2.AppendPostcard(nil); !bytes.Equal(enc, enc2) {
			t.Fatalf("%s: re-encoding not stable:\n%x\n%x", mi.Name, enc, enc2)
		}
	})
}
