package agent

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

const planted = "PLANTED-SECRET-7f3a9c" // 21 bytes

func plantedSecret(t *testing.T) *SecretMaterialV1 {
	m := first[*SecretMaterialV1](t)
	m.Bytes = SecretBytes(planted)
	return m
}

// assertRedacted fails if out contains the planted secret in any common
// rendering (raw, hex, base64-ish byte lists are covered by the raw and hex
// checks plus a decimal byte list).
func assertRedacted(t *testing.T, how, out string) {
	t.Helper()
	forms := []string{
		planted,
		hex.EncodeToString([]byte(planted)),
		strings.ToUpper(hex.EncodeToString([]byte(planted))),
		fmt.Sprint([]byte(planted)[:4]), // "[80 76 65 78"…
	}
	for _, f := range forms {
		if strings.Contains(out, strings.TrimSuffix(f, "]")) {
			t.Errorf("%s leaks the secret: %s", how, out)
			return
		}
	}
	if !strings.Contains(out, "redacted 21 bytes") {
		t.Errorf("%s does not show the redaction marker: %s", how, out)
	}
}

func TestSecretFmtRedacted(t *testing.T) {
	m := plantedSecret(t)
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%10.3v"} {
		assertRedacted(t, "pointer "+verb, fmt.Sprintf(verb, m))
		assertRedacted(t, "value "+verb, fmt.Sprintf(verb, *m))
		assertRedacted(t, "bytes "+verb, fmt.Sprintf(verb, m.Bytes))
	}
	assertRedacted(t, "Sprint", fmt.Sprint(m))
	assertRedacted(t, "Sprintln", fmt.Sprintln(*m))
	assertRedacted(t, "String", m.String())
	assertRedacted(t, "GoString", m.GoString())
	// Embedded in another value.
	assertRedacted(t, "nested %+v", fmt.Sprintf("%+v", struct{ M SecretMaterialV1 }{*m}))
	assertRedacted(t, "nested %#v", fmt.Sprintf("%#v", struct{ M SecretMaterialV1 }{*m}))
	assertRedacted(t, "slice %v", fmt.Sprintf("%v", []SecretMaterialV1{*m}))

	want := fmt.Sprintf("SecretMaterialV1{lease=%s, secret_id=\"ci/deploy-key\", bytes=<redacted 21 bytes>, expires_at_ms=%d}",
		m.Lease, m.ExpiresAtMs)
	if got := fmt.Sprintf("%v", m); got != want {
		t.Errorf("%%v = %s\nwant %s", got, want)
	}
	if got := fmt.Sprintf("%#v", m); !strings.HasPrefix(got, "agent.SecretMaterialV1{Lease:") {
		t.Errorf("%%#v = %s", got)
	}
}

func TestSecretSlogRedacted(t *testing.T) {
	m := plantedSecret(t)
	for _, h := range []struct {
		name string
		new  func(*bytes.Buffer) slog.Handler
	}{
		{"json", func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) }},
		{"text", func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) }},
	} {
		var buf bytes.Buffer
		log := slog.New(h.new(&buf))
		log.Info("delivering", "secret", m, "value", *m, "bytes", m.Bytes, slog.Any("any", m))
		out := buf.String()
		assertRedacted(t, "slog "+h.name, out)
		if !strings.Contains(out, "ci/deploy-key") || !strings.Contains(out, m.Lease.String()) {
			t.Errorf("slog %s lost the non-secret fields: %s", h.name, out)
		}
	}
}

func TestSecretJSONRedacted(t *testing.T) {
	m := plantedSecret(t)
	for name, v := range map[string]any{
		"pointer": m, "value": *m, "bytes": m.Bytes,
		"nested": struct {
			A *SecretMaterialV1
			B SecretMaterialV1
		}{m, *m},
	} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		assertRedacted(t, "json "+name, string(b))
	}
	b, _ := json.Marshal(m)
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back["secret_id"] != "ci/deploy-key" || back["bytes"] != "<redacted 21 bytes>" || back["lease"] != m.Lease.String() {
		t.Errorf("JSON form %s", b)
	}
}

func TestSecretZero(t *testing.T) {
	m := plantedSecret(t)
	m.Bytes = append(make(SecretBytes, 0, 64), planted...)
	full := m.Bytes[:cap(m.Bytes)]
	m.Zero()
	if len(m.Bytes) != len(planted) {
		t.Errorf("Zero changed the length to %d", len(m.Bytes))
	}
	for i, c := range full {
		if c != 0 {
			t.Fatalf("byte %d not zeroed", i)
		}
	}
	(&SecretMaterialV1{}).Zero() // nil bytes: no panic
}

// Decoding copies the secret out of the frame and clears storage it reuses.
func TestSecretDecodeCopiesAndClears(t *testing.T) {
	m := plantedSecret(t)
	frame := m.AppendPostcard(nil)
	var got SecretMaterialV1
	d := postcard.NewDecoder(frame)
	got.DecodePostcard(&d)
	if err := d.Finish(); err != nil {
		t.Fatal(err)
	}
	clear(frame)
	if string(got.Bytes) != planted {
		t.Fatal("decoded secret aliases the input frame")
	}
	// Decode a shorter secret into the same value: the old tail is cleared.
	short := &SecretMaterialV1{Lease: m.Lease, SecretID: "x", Bytes: SecretBytes("abc"), ExpiresAtMs: 1}
	old := got.Bytes[:cap(got.Bytes)]
	d = postcard.NewDecoder(short.AppendPostcard(nil))
	got.DecodePostcard(&d)
	if d.Err() != nil || string(got.Bytes) != "abc" {
		t.Fatalf("short decode: %v %q", d.Err(), []byte(got.Bytes))
	}
	if bytes.Contains(old, []byte("SECRET")) {
		t.Error("storage reused for a shorter secret still holds the old one")
	}
	// Decode a secret longer than the storage: new storage, and the old
	// storage is cleared.
	old = got.Bytes[:cap(got.Bytes)]
	long := &SecretMaterialV1{Lease: m.Lease, SecretID: "x", Bytes: make(SecretBytes, 4*cap(old)), ExpiresAtMs: 1}
	for i := range long.Bytes {
		long.Bytes[i] = 'L'
	}
	copy(old, "OLD")
	d = postcard.NewDecoder(long.AppendPostcard(nil))
	got.DecodePostcard(&d)
	if d.Err() != nil || !bytes.Equal(got.Bytes, long.Bytes) {
		t.Fatal("long decode failed")
	}
	if !bytes.Equal(old, make([]byte, len(old))) {
		t.Error("replaced storage not cleared")
	}
}

// Errors never carry the secret.
func TestSecretValidationErrorClean(t *testing.T) {
	m := plantedSecret(t)
	m.ExpiresAtMs = 0
	err := m.Validate()
	if err == nil || strings.Contains(err.Error(), planted) {
		t.Errorf("Validate: %v", err)
	}
}

// TestSecretBytesBoundFitsFrame: MaxSecretBytes (61440, 60 KiB) is the
// bound that lets the largest SecretMaterialV1 travel in one frame of the
// secret stream with the largest envelope; 64 KiB of bytes would not fit.
func TestSecretBytesBoundFitsFrame(t *testing.T) {
	if MaxSecretBytes != 61440 {
		t.Fatalf("MaxSecretBytes = %d; the docs say 61440", MaxSecretBytes)
	}
	limit := wire.StreamSecret.FrameLimit()
	const payloadHead = 2 * 5 // varint(family) ‖ varint(variant), u32 each
	if need := wire.EnvelopeHeaderMaxSize + payloadHead + maxSecretMaterialSize; need > limit {
		t.Fatalf("largest SecretMaterialV1 frame body is %d bytes, over the secret stream's %d", need, limit)
	}
	m := first[*SecretMaterialV1](t)
	m.SecretID = strings.Repeat("s", MaxSecretID)
	m.Bytes = make(SecretBytes, MaxSecretBytes)
	env := &wire.Envelope{Protocol: wire.Current, HasCorrelation: true, SentAtMs: math.MaxUint64, Payload: m}
	if _, err := wire.AppendEnvelopeFrame(nil, limit, env); err != nil {
		t.Fatalf("largest SecretMaterialV1 does not fit a secret frame: %v", err)
	}
	m.Bytes = make(SecretBytes, 64<<10)
	if _, err := wire.AppendEnvelopeFrame(nil, limit, env); err == nil {
		t.Fatal("a 65536-byte secret fits a secret frame; the 60 KiB bound could be raised")
	}
}
