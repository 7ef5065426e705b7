package wire_test

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

func testRegistry(t *testing.T) *wire.Registry {
	t.Helper()
	r, err := wire.NewRegistry(wire.CommonMessages)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func fixedULID(seed byte) ulid.ULID {
	var u ulid.ULID
	for i := range u {
		u[i] = seed + byte(i)
	}
	return u
}

func TestEnvelopeRoundTrip(t *testing.T) {
	reg := testRegistry(t)
	payload := &wire.WireErrorV1{Code: wire.ErrCodeStaleLease, Retry: wire.RetryResync, Message: "lease expired ✓"}
	cases := []struct {
		name string
		env  wire.Envelope
		size int
	}{
		{"plain", wire.Envelope{Protocol: wire.V(1, 0), MessageID: wire.MessageId{fixedULID(1)}, SentAtMs: 1767225600000, Payload: payload}, 0},
		{"correlation", *(&wire.Envelope{Protocol: wire.V(1, 2), MessageID: wire.MessageId{fixedULID(2)}, SentAtMs: 5, Payload: payload}).
			WithCorrelation(wire.CorrelationId{fixedULID(100)}), 16},
		{"trace", wire.Envelope{Protocol: wire.V(1, 0), MessageID: wire.MessageId{fixedULID(3)}, HasTrace: true,
			Trace: wire.TraceContext{TraceID: [16]byte{1, 2, 3}, SpanID: [8]byte{9, 8, 7}, Flags: 1}, Payload: payload}, 25},
		{"both", wire.Envelope{Protocol: wire.V(1, 0), MessageID: wire.MessageId{fixedULID(4)}, HasCorrelation: true,
			CorrelationID: wire.CorrelationId{fixedULID(5)}, HasTrace: true, Trace: wire.TraceContext{Flags: 0xff}, Payload: payload}, 41},
	}
	var base int
	for i, c := range cases {
		b := c.env.AppendPostcard(nil)
		sentAt := postcard.UvarintLen(c.env.SentAtMs)
		if i == 0 {
			base = len(b) - sentAt
		}
		got, err := wire.DecodeEnvelope(b, reg)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !reflect.DeepEqual(*got, c.env) {
			t.Fatalf("%s: decoded\n%+v\nwant\n%+v", c.name, *got, c.env)
		}
		if err := got.Payload.Validate(); err != nil {
			t.Fatalf("%s: Validate: %v", c.name, err)
		}
		// Option fields cost exactly their payload when present.
		if len(b)-sentAt != base+c.size {
			t.Fatalf("%s: %d bytes, want %d", c.name, len(b), base+c.size+sentAt)
		}
		// Trailing bytes and truncation are errors.
		if _, err := wire.DecodeEnvelope(append(b[:len(b):len(b)], 0), reg); !errors.Is(err, postcard.ErrTrailingBytes) {
			t.Fatalf("%s: trailing byte: %v", c.name, err)
		}
		for n := 0; n < len(b); n++ {
			if _, err := wire.DecodeEnvelope(b[:n], reg); err == nil {
				t.Fatalf("%s: prefix of %d bytes decoded", c.name, n)
			}
		}
		if len(b) > wire.EnvelopeHeaderMaxSize+wire.CommonMessages[0].MaxSize {
			t.Fatalf("%s: %d bytes exceeds header bound + message bound", c.name, len(b))
		}
	}
	if got := cases[2].env.Trace.Traceparent(); got != "00-01020300000000000000000000000000-0908070000000000-01" {
		t.Fatalf("Traceparent = %s", got)
	}
}

func TestEnvelopeHeaderLayout(t *testing.T) {
	e := wire.Envelope{Protocol: wire.V(1, 0), MessageID: wire.MessageId{fixedULID(0x10)}, SentAtMs: 0,
		Payload: &wire.WireErrorV1{Code: wire.ErrCodeInternal, Retry: wire.RetryNever}}
	b := e.AppendPostcard(nil)
	want := []byte{1, 0}
	want = append(want, fixedULID(0x10).Bytes()...)
	want = append(want, 0, 0, 0) // no correlation, sent_at 0, no trace
	want = append(want, 0, 1)    // family common, variant 1
	want = append(want, 20, 0, 0)
	if !bytes.Equal(b, want) {
		t.Fatalf("envelope bytes\n got %x\nwant %x", b, want)
	}
}

func TestEnvelopeErrors(t *testing.T) {
	reg := testRegistry(t)
	e := wire.Envelope{MessageID: wire.MessageId{fixedULID(1)}, Payload: &wire.WireErrorV1{Code: 1}}
	b := e.AppendPostcard(nil)
	hdr := len(b) - 5 // 2-byte type + 3-byte body
	// Unknown variant in a known family.
	bad := append(append([]byte(nil), b[:hdr]...), 0, 9, 1, 0, 0)
	var ue *wire.UnknownMessageError
	if _, err := wire.DecodeEnvelope(bad, reg); !errors.As(err, &ue) || ue.Type != wire.TypeID(wire.FamilyCommon, 9) {
		t.Fatalf("unknown variant: %v", err)
	}
	// A family number beyond 255.
	bad = append(append([]byte(nil), b[:hdr]...), 0x80, 0x02, 1)
	if _, err := wire.DecodeEnvelope(bad, reg); !errors.As(err, &ue) {
		t.Fatalf("huge family: %v", err)
	}
	// Bad option tag for the correlation id.
	bad = append([]byte(nil), b...)
	bad[18] = 2
	if _, err := wire.DecodeEnvelope(bad, reg); !errors.Is(err, postcard.ErrBadOption) {
		t.Fatalf("bad option: %v", err)
	}
	// A body above the message's MaxSize is refused before decoding it.
	big := append(append([]byte(nil), b[:hdr+2]...), make([]byte, wire.CommonMessages[0].MaxSize+1)...)
	if _, err := wire.DecodeEnvelope(big, reg); !errors.Is(err, postcard.ErrLengthOverBound) {
		t.Fatalf("over-size body: %v", err)
	}
	// Unknown retry class.
	bad = append(append([]byte(nil), b[:hdr+2]...), 1, 5, 0)
	if _, err := wire.DecodeEnvelope(bad, reg); !errors.Is(err, postcard.ErrBadEnum) {
		t.Fatalf("bad retry class: %v", err)
	}
	// Unknown error codes decode (a newer peer) but code 0 fails Validate.
	var m wire.WireErrorV1
	d := postcard.NewDecoder([]byte{0x80, 0x02, 0, 0})
	m.DecodePostcard(&d)
	if d.Finish() != nil || m.Code != 256 || m.Validate() != nil || m.Code.Known() {
		t.Fatalf("unknown code: %+v %v", m, d.Err())
	}
	if (&wire.WireErrorV1{}).Validate() == nil {
		t.Fatal("code 0 must fail Validate")
	}
}

func TestWireErrorMessageTruncated(t *testing.T) {
	long := string(bytes.Repeat([]byte("€"), 200)) // 600 bytes
	m := &wire.WireErrorV1{Code: wire.ErrCodeInternal, Message: long}
	b := m.AppendPostcard(nil)
	var got wire.WireErrorV1
	d := postcard.NewDecoder(b)
	got.DecodePostcard(&d)
	if err := d.Finish(); err != nil {
		t.Fatal(err)
	}
	if len(got.Message) != 510 || got.Message != long[:510] {
		t.Fatalf("truncated to %d bytes, want 510 at a rune boundary", len(got.Message))
	}
	if s := m.Error(); !strings.HasPrefix(s, "peer error Internal (retry Never): €") {
		t.Fatalf("Error() = %.60q", s)
	}
}

func TestRegistry(t *testing.T) {
	r := testRegistry(t)
	mi, ok := r.Lookup(wire.MsgError)
	if !ok || mi.Name != "common.WireErrorV1" || len(r.All()) != 1 {
		t.Fatalf("Lookup: %+v %v", mi, ok)
	}
	if _, err := wire.NewRegistry(wire.CommonMessages, wire.CommonMessages); err == nil {
		t.Fatal("duplicate registration accepted")
	}
	renamed := []wire.MessageInfo{wire.CommonMessages[0]}
	renamed[0].Type = wire.TypeID(wire.FamilyCommon, 2)
	if _, err := wire.NewRegistry(renamed); err == nil {
		t.Fatal("mismatched MessageType accepted")
	}
	if wire.MsgError.Family() != wire.FamilyCommon || wire.MsgError.Variant() != 1 || wire.MsgError.String() != "0x0001" {
		t.Fatal("MsgError numbering")
	}
	if wire.TypeID(wire.FamilyAgent, 0x10) != 0x0110 || wire.FamilyDevice.String() != "device" || wire.Family(9).String() != "family(9)" {
		t.Fatal("TypeID/Family")
	}
}

func TestIdsAndDigests(t *testing.T) {
	var g wire.Digest
	for i := range g {
		g[i] = byte(i)
	}
	ref := wire.CasObjectRef{Algorithm: wire.DigestBLAKE3, Digest: g, Size: 1 << 20}
	b := ref.AppendPostcard(nil)
	if len(b) != 1+32+3 || b[0] != 1 {
		t.Fatalf("CasObjectRef encoding %x", b)
	}
	var got wire.CasObjectRef
	d := postcard.NewDecoder(b)
	got.DecodePostcard(&d)
	if d.Finish() != nil || got != ref {
		t.Fatalf("CasObjectRef round trip %+v %v", got, d.Err())
	}
	b[0] = 2
	d = postcard.NewDecoder(b)
	got.DecodePostcard(&d)
	if !errors.Is(d.Err(), postcard.ErrBadEnum) {
		t.Fatalf("unknown digest algorithm: %v", d.Err())
	}
	if ref.String() != "blake3:"+g.String() || g.String()[:6] != "000102" || g.IsZero() || !(wire.Digest{}).IsZero() {
		t.Fatal("Digest String/IsZero")
	}
	u := wire.NewLeaseId()
	ub := wire.AppendULID(nil, u.ULID)
	var u2 wire.LeaseId
	d = postcard.NewDecoder(ub)
	wire.ReadULID(&d, &u2.ULID)
	if d.Finish() != nil || u2 != u || len(ub) != 16 {
		t.Fatal("ULID round trip")
	}
	var g2 wire.Digest
	d = postcard.NewDecoder(wire.AppendDigest(nil, g))
	wire.ReadDigest(&d, &g2)
	if d.Finish() != nil || g2 != g {
		t.Fatal("Digest round trip")
	}
}
