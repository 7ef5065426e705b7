package wire_test

import (
	"testing"
	"unicode/utf8"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

// FuzzCloseFrame decodes a yamux final close record body (wire.CloseFrame,
// §103): a decode either fails with a typed postcard error or yields a
// reason within MaxCloseReason that re-encodes to the same bytes.
func FuzzCloseFrame(f *testing.F) {
	for _, cf := range []wire.CloseFrame{{}, {Code: wire.CloseShutdown, Reason: "daemon shutting down"},
		{Code: wire.CloseOverloaded, Reason: "overloaded: retry with backoff"}, {Code: 4000, Reason: "é"}} {
		f.Add(cf.AppendPostcard(nil))
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, body []byte) {
		var cf wire.CloseFrame
		d := postcard.NewDecoder(body)
		cf.DecodePostcard(&d)
		if err := d.Finish(); err != nil {
			if _, ok := err.(*postcard.Error); !ok {
				t.Fatalf("untyped decode error %T: %v", err, err)
			}
			return
		}
		if len(cf.Reason) > wire.MaxCloseReason || !utf8.ValidString(cf.Reason) {
			t.Fatalf("reason of %d bytes (valid UTF-8 %v) accepted", len(cf.Reason), utf8.ValidString(cf.Reason))
		}
		_ = cf.Code.String()
		var again wire.CloseFrame
		d2 := postcard.NewDecoder(cf.AppendPostcard(nil))
		again.DecodePostcard(&d2)
		if err := d2.Finish(); err != nil || again != cf {
			t.Fatalf("close frame round trip: %+v → %+v (%v)", cf, again, err)
		}
	})
}
