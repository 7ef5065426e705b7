package wire_test

import (
	"errors"
	"testing"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

func rng(a, b, c, d uint16) wire.ProtocolRange {
	return wire.ProtocolRange{Min: wire.V(a, b), Max: wire.V(c, d)}
}

func TestNegotiate(t *testing.T) {
	cases := []struct {
		name          string
		server, agent wire.ProtocolRange
		want          wire.ProtocolVersion
	}{
		{"identical", rng(1, 0, 1, 0), rng(1, 0, 1, 0), wire.V(1, 0)},
		{"agent newer", rng(1, 0, 2, 3), rng(1, 2, 3, 0), wire.V(2, 3)},
		{"server newer", rng(1, 0, 4, 2), rng(1, 0, 2, 1), wire.V(2, 1)},
		{"same major, different minor", rng(1, 0, 1, 4), rng(1, 2, 1, 9), wire.V(1, 4)},
		{"same major, agent minor lower", rng(1, 3, 1, 9), rng(1, 0, 1, 5), wire.V(1, 5)},
		{"touching at one version", rng(1, 0, 2, 0), rng(2, 0, 3, 0), wire.V(2, 0)},
		{"nested", rng(1, 0, 9, 9), rng(3, 1, 3, 4), wire.V(3, 4)},
	}
	for _, c := range cases {
		got, err := wire.Negotiate(c.server, c.agent)
		if err != nil || got != c.want {
			t.Errorf("%s: Negotiate(%v, %v) = %v, %v; want %v", c.name, c.server, c.agent, got, err, c.want)
		}
		// Negotiation is symmetric in its result.
		if got2, err := wire.Negotiate(c.agent, c.server); err != nil || got2 != c.want {
			t.Errorf("%s (swapped) = %v, %v", c.name, got2, err)
		}
	}
}

func TestNegotiateDisjoint(t *testing.T) {
	_, err := wire.Negotiate(rng(3, 0, 4, 2), rng(1, 0, 2, 1))
	var ne *wire.NegotiationError
	if !errors.As(err, &ne) {
		t.Fatalf("err = %v (%T), want *NegotiationError", err, err)
	}
	const want = "no common protocol version: server supports 3.0–4.2, agent supports 1.0–2.1"
	if err.Error() != want {
		t.Fatalf("message %q, want %q", err.Error(), want)
	}
	if ne.Server != rng(3, 0, 4, 2) || ne.Agent != rng(1, 0, 2, 1) {
		t.Fatalf("ranges not carried: %+v", ne)
	}
	// Same major, disjoint minors.
	if _, err := wire.Negotiate(rng(1, 5, 1, 9), rng(1, 0, 1, 4)); !errors.As(err, &ne) {
		t.Fatalf("disjoint minors: %v", err)
	}
}

func TestNegotiateInvalidRanges(t *testing.T) {
	for _, c := range []struct{ server, agent wire.ProtocolRange }{
		{rng(2, 0, 1, 0), rng(1, 0, 2, 0)},
		{rng(1, 0, 2, 0), rng(1, 5, 1, 4)},
		{rng(3, 0, 1, 0), rng(3, 0, 1, 0)},
	} {
		v, err := wire.Negotiate(c.server, c.agent)
		var ne *wire.NegotiationError
		if !errors.As(err, &ne) || v != (wire.ProtocolVersion{}) {
			t.Errorf("Negotiate(%v, %v) = %v, %v; want *NegotiationError", c.server, c.agent, v, err)
		}
	}
	if rng(2, 0, 1, 0).Valid() || !rng(1, 0, 1, 0).Valid() {
		t.Fatal("Valid")
	}
}

func TestVersionBasics(t *testing.T) {
	if !wire.V(1, 9).Less(wire.V(2, 0)) || wire.V(2, 0).Less(wire.V(1, 9)) || wire.V(1, 1).Less(wire.V(1, 1)) {
		t.Fatal("Less ordering")
	}
	r := rng(1, 2, 3, 4)
	if !r.Contains(wire.V(1, 2)) || !r.Contains(wire.V(3, 4)) || !r.Contains(wire.V(2, 99)) ||
		r.Contains(wire.V(1, 1)) || r.Contains(wire.V(3, 5)) {
		t.Fatal("Contains")
	}
	if !wire.Supported.Contains(wire.Current) {
		t.Fatal("Supported must contain Current")
	}
	b := r.AppendPostcard(nil)
	if got := string(b); got != "\x01\x02\x03\x04" {
		t.Fatalf("range encoding %x", b)
	}
	b = wire.V(300, 65535).AppendPostcard(nil)
	d := postcard.NewDecoder(b)
	var v wire.ProtocolVersion
	v.DecodePostcard(&d)
	if d.Finish() != nil || v != wire.V(300, 65535) {
		t.Fatalf("version round trip %v, %v", v, d.Err())
	}
	var r2 wire.ProtocolRange
	d = postcard.NewDecoder(r.AppendPostcard(nil))
	r2.DecodePostcard(&d)
	if d.Finish() != nil || r2 != r {
		t.Fatalf("range round trip %v", r2)
	}
}

func TestFeatureSet(t *testing.T) {
	s := wire.Features(wire.FeatureLogResumeV1, wire.FeatureTraceContextV1, wire.FeatureSigningV1)
	if !s.Has(wire.FeatureSigningV1) || s.Has(wire.FeatureDeviceControlV1) {
		t.Fatal("Has")
	}
	if got := s.String(); got != "{LogResumeV1,SigningV1,TraceContextV1}" {
		t.Fatalf("String = %s", got)
	}
	b := s.AppendPostcard(nil)
	if string(b) != "\x03\x01\x05\x06" {
		t.Fatalf("encoding %x, want 03 01 05 06", b)
	}
	var got wire.FeatureSet
	d := postcard.NewDecoder(b)
	got.DecodePostcard(&d)
	if d.Finish() != nil || got != s {
		t.Fatalf("round trip %v, %v", got, d.Err())
	}
	// Unknown features from a newer peer are ignored, not errors.
	in := postcard.AppendLen(nil, 5)
	for _, f := range []uint16{1, 64, 9000, 63, 65535} {
		in = postcard.AppendU16(in, f)
	}
	d = postcard.NewDecoder(in)
	got = wire.Features(wire.FeatureSigningV1) // must be replaced, not merged
	got.DecodePostcard(&d)
	if d.Finish() != nil || got != wire.Features(1, 63) {
		t.Fatalf("unknown-tolerant decode = %v, %v", got, d.Err())
	}
	if wire.ProtocolFeature(63).String() != "Feature(63)" || wire.Features(64, 1000) != 0 {
		t.Fatal("features above 63 must be dropped")
	}
	// Intersection (§247) and List order.
	o := wire.Features(wire.FeatureSigningV1, wire.FeatureCasRangeResumeV1)
	if s.Intersect(o) != wire.Features(wire.FeatureSigningV1) {
		t.Fatal("Intersect")
	}
	l := wire.Features(6, 2, 4).List()
	if len(l) != 3 || l[0] != 2 || l[1] != 4 || l[2] != 6 {
		t.Fatalf("List = %v", l)
	}
	// Over-bound count is refused.
	d = postcard.NewDecoder(postcard.AppendLen(nil, wire.MaxFeatures+1))
	got.DecodePostcard(&d)
	if !errors.Is(d.Err(), postcard.ErrLengthOverBound) {
		t.Fatalf("over-bound features: %v", d.Err())
	}
	// The empty set is one byte.
	if b := wire.FeatureSet(0).AppendPostcard(nil); string(b) != "\x00" {
		t.Fatalf("empty set = %x", b)
	}
}

func TestParseRange(t *testing.T) {
	for in, want := range map[string]wire.ProtocolRange{
		"1.0-1.1": {wire.V(1, 0), wire.V(1, 1)}, "2.0": {wire.V(2, 0), wire.V(2, 0)}, "1.0–1.0": {wire.V(1, 0), wire.V(1, 0)},
	} {
		got, err := wire.ParseRange(in)
		if err != nil || got != want {
			t.Errorf("ParseRange(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "1", "1.x", "1.1-1.0", "70000.0", "1.0-"} {
		if r, err := wire.ParseRange(in); err == nil {
			t.Errorf("ParseRange(%q) = %v, want an error", in, r)
		}
	}
}
