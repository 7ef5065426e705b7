package vectors

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"reflect"
	"testing"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/cas"
	"forgeyard.dev/transport/wire/logs"
	"forgeyard.dev/transport/wire/postcard"
	"forgeyard.dev/transport/wire/registry"
)

// Fuzz targets (§182–184). Every target is seeded with every committed
// golden vector, so plain `go test` replays the vectors and the inputs kept
// under testdata/fuzz/<FuzzName>/ through the same invariants:
//
//   - decoding never panics and never allocates beyond the input's bounds;
//   - whatever decodes re-encodes, and the re-encoding decodes to an equal
//     value and re-encodes to the same bytes (round trip);
//   - Validate never panics on a decoded value.

// familyFuzzers lists the per-family targets; TestFuzzTargetsCoverFamilies
// fails when a registered family has none.
var familyFuzzers = map[wire.Family]func(*testing.F){
	wire.FamilyCommon:  FuzzFamilyCommon,
	wire.FamilyAgent:   FuzzFamilyAgent,
	wire.FamilyLogs:    FuzzFamilyLogs,
	wire.FamilyCas:     FuzzFamilyCas,
	wire.FamilyHealth:  FuzzFamilyHealth,
	wire.FamilyAdmin:   FuzzFamilyAdmin,
	wire.FamilySigning: FuzzFamilySigning,
	wire.FamilyDevice:  FuzzFamilyDevice,
}

func TestFuzzTargetsCoverFamilies(t *testing.T) {
	for _, f := range registry.Families() {
		if familyFuzzers[f.Family] == nil {
			t.Errorf("family %s has no FuzzFamily target", f.Name())
		}
	}
}

// committedFrames returns the frame of every committed vector, all versions.
func committedFrames(tb testing.TB) [][]byte {
	tb.Helper()
	dirs, err := VersionDirs(testdata)
	if err != nil || len(dirs) == 0 {
		tb.Fatalf("no vector directories: %v", err)
	}
	var out [][]byte
	for _, dir := range dirs {
		files, err := ReadDir(dir)
		if err != nil {
			tb.Fatal(err)
		}
		for _, fam := range sortedKeys(files) {
			for _, v := range files[fam] {
				b, err := hex.DecodeString(v.FrameHex)
				if err != nil {
					tb.Fatalf("%s: %v", v.Name, err)
				}
				out = append(out, b)
			}
		}
	}
	return out
}

// frameBody strips the varint length prefix of one frame.
func frameBody(tb testing.TB, frame []byte) []byte {
	fr := wire.NewFrameReader(bytes.NewReader(frame), wire.MaxAnyFrame)
	b, err := fr.Next()
	if err != nil {
		tb.Fatalf("frame: %v", err)
	}
	return append([]byte(nil), b...)
}

// checkEnvelopeRoundTrip asserts the round-trip invariant for a decoded
// envelope.
func checkEnvelopeRoundTrip(t *testing.T, r *wire.Registry, env *wire.Envelope) {
	_ = env.Payload.Validate()
	enc := env.AppendPostcard(nil)
	env2, err := wire.DecodeEnvelope(enc, r)
	if err != nil {
		t.Fatalf("re-encoded envelope does not decode: %v\n%x", err, enc)
	}
	if !reflect.DeepEqual(env, env2) {
		t.Fatalf("round trip changed the envelope:\n%#v\n%#v", env, env2)
	}
	if enc2 := env2.AppendPostcard(nil); !bytes.Equal(enc, enc2) {
		t.Fatalf("re-encoding is not stable:\n%x\n%x", enc, enc2)
	}
}

// FuzzEnvelope decodes a frame body as an envelope with registry.Default.
func FuzzEnvelope(f *testing.F) {
	for _, fr := range committedFrames(f) {
		body := frameBody(f, fr)
		f.Add(body)
		// The same envelope with a trace context and without a correlation.
		if env, err := wire.DecodeEnvelope(body, registry.Default); err == nil {
			env.HasTrace = true
			env.Trace = wire.TraceContext{TraceID: [16]byte{1, 2, 3}, SpanID: [8]byte{4, 5}, Flags: 1}
			env.HasCorrelation = false
			f.Add(env.AppendPostcard(nil))
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		env, err := wire.DecodeEnvelope(body, registry.Default)
		if err != nil {
			checkDecodeError(t, err)
			return
		}
		checkEnvelopeRoundTrip(t, registry.Default, env)
	})
}

// checkDecodeError asserts that a decode failure is one of the typed errors
// the wire layer documents, never an untyped one.
func checkDecodeError(t *testing.T, err error) {
	var pe *postcard.Error
	var ue *wire.UnknownMessageError
	if !errors.As(err, &pe) && !errors.As(err, &ue) {
		t.Fatalf("untyped decode error %T: %v", err, err)
	}
}

// FuzzFrames feeds a byte stream to a FrameReader with the control-stream
// limit and decodes every frame it yields (§182).
func FuzzFrames(f *testing.F) {
	frames := committedFrames(f)
	var all []byte
	for _, fr := range frames {
		f.Add(fr)
		all = append(all, fr...)
	}
	f.Add(all)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, stream []byte) {
		fr := wire.NewFrameReader(bytes.NewReader(stream), wire.MaxControlFrame)
		for i := 0; i <= len(stream); i++ { // each frame consumes ≥ 1 byte
			body, err := fr.Next()
			if err != nil {
				var tooLarge *wire.FrameTooLargeError
				if err != io.EOF && err != io.ErrUnexpectedEOF && !errors.Is(err, wire.ErrFramePrefix) && !errors.As(err, &tooLarge) {
					t.Fatalf("frame reader: unexpected error %T: %v", err, err)
				}
				return
			}
			if len(body) > wire.MaxControlFrame {
				t.Fatalf("frame of %d bytes above the limit", len(body))
			}
			env, err := wire.DecodeEnvelope(body, registry.Default)
			if err != nil {
				checkDecodeError(t, err)
				continue
			}
			checkEnvelopeRoundTrip(t, registry.Default, env)
		}
		t.Fatal("frame reader did not terminate")
	})
}

// fuzzFamily decodes varint(variant) ‖ body as the payload enum of one
// family, with a registry holding only that family.
func fuzzFamily(f *testing.F, fam wire.Family) {
	var famInfo *registry.Family
	for _, x := range registry.Families() {
		if x.Family == fam {
			famInfo = &x
		}
	}
	if famInfo == nil {
		f.Fatalf("family %s not registered", fam)
	}
	reg := wire.MustRegistry(famInfo.Messages)
	famPrefix := postcard.AppendVariant(nil, uint32(fam))
	for _, fr := range committedFrames(f) {
		env, err := wire.DecodeEnvelope(frameBody(f, fr), registry.Default)
		if err != nil || env.Payload.MessageType().Family() != fam {
			continue
		}
		p := wire.AppendMessage(nil, env.Payload)
		f.Add(p[len(famPrefix):])
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		payload := append(append([]byte(nil), famPrefix...), in...)
		d := postcard.NewDecoder(payload)
		m, err := reg.DecodeMessage(&d)
		if err != nil {
			checkDecodeError(t, err)
			return
		}
		if m.MessageType().Family() != fam {
			t.Fatalf("decoded %s outside family %s", m.MessageType(), fam)
		}
		_ = m.Validate()
		enc := wire.AppendMessage(nil, m)
		d2 := postcard.NewDecoder(enc)
		m2, err := reg.DecodeMessage(&d2)
		if err != nil {
			t.Fatalf("re-encoded %T does not decode: %v", m, err)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip changed %T:\n%#v\n%#v", m, m, m2)
		}
		if enc2 := wire.AppendMessage(nil, m2); !bytes.Equal(enc, enc2) {
			t.Fatalf("re-encoding of %T not stable", m)
		}
	})
}

// FuzzFamilyCommon fuzzes the common family's payload enum.
func FuzzFamilyCommon(f *testing.F) { fuzzFamily(f, wire.FamilyCommon) }

// FuzzFamilyAgent fuzzes the agent-control family's payload enum.
func FuzzFamilyAgent(f *testing.F) { fuzzFamily(f, wire.FamilyAgent) }

// FuzzFamilyLogs fuzzes the logs family's payload enum.
func FuzzFamilyLogs(f *testing.F) { fuzzFamily(f, wire.FamilyLogs) }

// FuzzFamilyCas fuzzes the CAS family's payload enum.
func FuzzFamilyCas(f *testing.F) { fuzzFamily(f, wire.FamilyCas) }

// FuzzFamilyHealth fuzzes the health family's payload enum.
func FuzzFamilyHealth(f *testing.F) { fuzzFamily(f, wire.FamilyHealth) }

// FuzzFamilyAdmin fuzzes the admin family's payload enum.
func FuzzFamilyAdmin(f *testing.F) { fuzzFamily(f, wire.FamilyAdmin) }

// FuzzFamilySigning fuzzes the signing family's payload enum.
func FuzzFamilySigning(f *testing.F) { fuzzFamily(f, wire.FamilySigning) }

// FuzzFamilyDevice fuzzes the device family's payload enum.
func FuzzFamilyDevice(f *testing.F) { fuzzFamily(f, wire.FamilyDevice) }

// FuzzStreamHeaders decodes a frame body as every header that opens a
// stream: the StreamHeader (§40, §184) and the family headers that follow
// it on log and CAS streams.
func FuzzStreamHeaders(f *testing.F) {
	for k := wire.StreamKind(0); k < wire.NumStreamKinds+1; k++ {
		h := wire.StreamHeader{Kind: k, Version: wire.Current}
		f.Add(h.AppendPostcard(nil))
	}
	for _, fr := range committedFrames(f) {
		env, err := wire.DecodeEnvelope(frameBody(f, fr), registry.Default)
		if err != nil {
			continue
		}
		switch env.Payload.(type) {
		case *logs.LogStreamHeaderV1, *cas.CasObjectStreamHeaderV1:
			f.Add(env.Payload.AppendPostcard(nil))
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if h, err := wire.ParseStreamHeader(body); err == nil {
			if !h.Kind.Valid() {
				t.Fatalf("parsed unknown kind %d", h.Kind)
			}
			h2, err := wire.ParseStreamHeader(h.AppendPostcard(nil))
			if err != nil || h2 != h {
				t.Fatalf("stream header round trip: %v %v %v", h, h2, err)
			}
		} else {
			checkDecodeError(t, err)
		}
		fuzzBody(t, body, func() wire.Message { return new(logs.LogStreamHeaderV1) })
		fuzzBody(t, body, func() wire.Message { return new(cas.CasObjectStreamHeaderV1) })
	})
}

// fuzzBody decodes body as one message of the type newMsg makes, strictly
// (the body must fill the input), and checks the round trip.
func fuzzBody(t *testing.T, body []byte, newMsg func() wire.Message) {
	m := newMsg()
	d := postcard.NewDecoder(body)
	m.DecodePostcard(&d)
	if err := d.Finish(); err != nil {
		checkDecodeError(t, err)
		return
	}
	_ = m.Validate()
	enc := m.AppendPostcard(nil)
	m2 := newMsg()
	d2 := postcard.NewDecoder(enc)
	m2.DecodePostcard(&d2)
	if err := d2.Finish(); err != nil {
		t.Fatalf("re-encoded %T does not decode: %v", m, err)
	}
	if !reflect.DeepEqual(m, m2) {
		t.Fatalf("round trip changed %T:\n%#v\n%#v", m, m, m2)
	}
}
