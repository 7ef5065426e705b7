package main

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/cas"
	"forgeyard.dev/transport/wire/logs"
	"forgeyard.dev/transport/wire/postcard"
	"forgeyard.dev/transport/wire/registry"
	"forgeyard.dev/transport/wire/vectors"
)

const vectorRoot = "../../wire/vectors/testdata"

type result struct {
	code           int
	stdout, stderr string
}

func runWith(reg *wire.Registry, stdin []byte, args ...string) result {
	var out, errb bytes.Buffer
	a := &app{reg: reg, stdin: bytes.NewReader(stdin), stdout: &out, stderr: &errb}
	code := a.run(args)
	return result{code, out.String(), errb.String()}
}

func runArgs(args ...string) result { return runWith(registry.Default, nil, args...) }

func allVectors(t *testing.T) []vectors.Vector {
	t.Helper()
	dirs, err := vectors.VersionDirs(vectorRoot)
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no vectors: %v", err)
	}
	var out []vectors.Vector
	for _, d := range dirs {
		files, err := vectors.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, vs := range files {
			out = append(out, vs...)
		}
	}
	return out
}

func checkNoCrash(t *testing.T, r result) {
	t.Helper()
	if strings.Contains(r.stderr, "internal error") || strings.Contains(r.stderr, "panic") {
		t.Fatalf("inspector panicked: %s", r.stderr)
	}
	if strings.Count(strings.TrimRight(r.stderr, "\n"), "\n") > 0 {
		t.Fatalf("error is not one line: %q", r.stderr)
	}
}

func TestVectorsCommandText(t *testing.T) {
	r := runArgs("vectors", vectorRoot)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	vs := allVectors(t)
	for _, v := range vs {
		if !strings.Contains(r.stdout, "-- "+v.Name+" ") {
			t.Errorf("output lacks vector %s", v.Name)
		}
	}
	for _, want := range []string{vectors.FixedMessageID.String(), vectors.FixedCorrelationID.String(), "2026-01-01T00:00:00Z", " 0 failed"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(r.stdout, "error:") {
		t.Errorf("a vector reported an error:\n%s", r.stdout)
	}
}

func TestVectorsCommandJSON(t *testing.T) {
	r := runArgs("vectors", "--json", vectorRoot)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var got []struct {
		Vector string         `json:"vector"`
		Frame  map[string]any `json:"frame"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("invalid JSON: %v", err)
	}
	vs := allVectors(t)
	if len(got) != len(vs) {
		t.Fatalf("%d JSON entries for %d vectors", len(got), len(vs))
	}
	for _, g := range got {
		name, _, _ := strings.Cut(g.Vector, "#")
		if g.Frame["name"] != name || g.Frame["error"] != nil || g.Frame["payload"] == nil {
			t.Errorf("%s: frame %v", g.Vector, g.Frame)
		}
	}
}

// TestDecodeEveryVector decodes each golden frame through --hex, in text
// and JSON, and checks the output names the message and shows its ids.
func TestDecodeEveryVector(t *testing.T) {
	for _, v := range allVectors(t) {
		name, _, _ := strings.Cut(v.Name, "#")
		r := runArgs("--hex", v.FrameHex)
		if r.code != 0 || !strings.Contains(r.stdout, "name: "+name+"\n") {
			t.Errorf("%s: exit %d stderr %q\n%s", v.Name, r.code, r.stderr, r.stdout)
		}
		r = runArgs("--json", "--hex", v.FrameHex)
		var got struct {
			Frames []map[string]any `json:"frames"`
			Error  string           `json:"error"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
			t.Fatalf("%s: invalid JSON: %v", v.Name, err)
		}
		if r.code != 0 || got.Error != "" || len(got.Frames) != 1 || got.Frames[0]["name"] != name ||
			got.Frames[0]["message_id"] != vectors.FixedMessageID.String() {
			t.Errorf("%s: exit %d, %v", v.Name, r.code, got)
		}
	}
}

func TestDecodeFileAndStdin(t *testing.T) {
	var capture []byte
	vs := allVectors(t)
	for _, v := range vs {
		b, _ := v.Frame()
		capture = append(capture, b...)
	}
	path := filepath.Join(t.TempDir(), "capture.bin")
	if err := os.WriteFile(path, capture, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, r := range []result{runArgs("--file", path), runWith(registry.Default, capture, "-")} {
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		if n := strings.Count(r.stdout, "\nframe ") + 1; !strings.HasPrefix(r.stdout, "frame 0 ") || n != len(vs) {
			t.Errorf("%d frames printed, want %d", n, len(vs))
		}
	}
	spaced := strings.ToUpper("0x" + strings.Join(splitEvery(hex.EncodeToString(capture), 7), " \n\t"))
	if r := runArgs("--hex", spaced); r.code != 0 {
		t.Errorf("hex with whitespace: exit %d: %s", r.code, r.stderr)
	}
}

func splitEvery(s string, n int) []string {
	var out []string
	for len(s) > n {
		out, s = append(out, s[:n]), s[n:]
	}
	return append(out, s)
}

func frameOf(t *testing.T, m wire.Message) []byte {
	t.Helper()
	b, err := wire.AppendEnvelopeFrame(nil, wire.MaxAnyFrame, vectors.FixedEnvelope(wire.Current, m))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestStreamMode(t *testing.T) {
	var s []byte
	s = wire.AppendStreamHeaderFrame(s, wire.StreamHeader{Kind: wire.StreamLog, Version: wire.Current})
	for _, m := range logs.Samples() {
		s = append(s, frameOf(t, m)...)
	}
	r := runArgs("--stream", "--hex", hex.EncodeToString(s))
	if r.code != 0 || !strings.HasPrefix(r.stdout, "stream header: kind log (2), version "+wire.Current.String()+"\n") ||
		strings.Count(r.stdout, "\nframe ") != len(logs.Samples()) {
		t.Errorf("log stream: exit %d %s\n%s", r.code, r.stderr, r.stdout)
	}
	// Without --stream the header frame is not an envelope.
	if r := runArgs("--hex", hex.EncodeToString(s)); r.code != 1 {
		t.Errorf("header frame decoded as envelope: exit %d", r.code)
	}

	var c []byte
	c = wire.AppendStreamHeaderFrame(c, wire.StreamHeader{Kind: wire.StreamCasUpload, Version: wire.Current})
	c = append(c, frameOf(t, &cas.CasObjectStreamHeaderV1{Lease: wire.LeaseId{ULID: vectors.FixedMessageID.ULID},
		Object: wire.CasObjectRef{Size: 100, Digest: wire.Digest{1}}, Length: 100})...)
	c = append(c, bytes.Repeat([]byte{0xab}, 100)...)
	r = runArgs("--stream", "--json", "--hex", hex.EncodeToString(c))
	var got struct {
		StreamHeader map[string]any   `json:"stream_header"`
		Frames       []map[string]any `json:"frames"`
		Raw          int              `json:"raw_object_bytes"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatal(err)
	}
	if r.code != 0 || got.StreamHeader["kind"] != "cas-upload" || len(got.Frames) != 1 || got.Raw != 100 {
		t.Errorf("cas stream: exit %d %s %+v", r.code, r.stderr, got)
	}
	if strings.Contains(r.stdout, "abababab") {
		t.Error("raw object bytes printed")
	}

	// A first frame that is no StreamHeader is decoded as an envelope.
	f := frameOf(t, logs.Samples()[0])
	if r := runArgs("--stream", "--hex", hex.EncodeToString(f)); r.code != 0 || !strings.Contains(r.stdout, "note: first frame is not a StreamHeader") {
		t.Errorf("fallback: exit %d %s\n%s", r.code, r.stderr, r.stdout)
	}
}

// TestUnknownTypeContinues shows an unknown message type, fails with exit
// 1, and still decodes the frames after it.
func TestUnknownTypeContinues(t *testing.T) {
	env := vectors.FixedEnvelope(wire.Current, &wire.WireErrorV1{Code: 1})
	body := env.AppendPostcard(nil)
	hdr := len(body) - len(wire.AppendMessage(nil, env.Payload))
	unknown := append(append([]byte(nil), body[:hdr]...), postcard.AppendVariant(postcard.AppendVariant(nil, 7), 0x7f)...)
	unknown = append(unknown, 1, 2, 3)
	in := append(postcard.AppendUvarint(nil, uint64(len(unknown))), unknown...)
	in = append(in, frameOf(t, &wire.WireErrorV1{Code: 2, Message: "after"})...)
	r := runArgs("--hex", hex.EncodeToString(in))
	checkNoCrash(t, r)
	if r.code != 1 || !strings.Contains(r.stdout, "type: 0x077f") || !strings.Contains(r.stdout, `Message: "after"`) ||
		!strings.Contains(r.stderr, "unknown message type 0x077f") {
		t.Errorf("exit %d stderr %q\n%s", r.code, r.stderr, r.stdout)
	}
}

// fakeSecret is a sensitive message for the redaction test, registered in
// a test registry next to every real type.
type fakeSecret struct{ Key []byte }

const fakeSecretType = wire.MessageTypeId(0x07fe)

func (*fakeSecret) MessageType() wire.MessageTypeId      { return fakeSecretType }
func (m *fakeSecret) AppendPostcard(b []byte) []byte     { return postcard.AppendBytes(b, m.Key) }
func (m *fakeSecret) DecodePostcard(d *postcard.Decoder) { m.Key = d.Bytes(256) }
func (m *fakeSecret) Validate() error                    { return nil }
func (m *fakeSecret) String() string                     { return "fakeSecret{key=<redacted>}" }

// secretByteStrings collects every byte-slice value inside v of at least 4
// bytes: the material a sensitive message must never show.
func secretByteStrings(v reflect.Value, out *[][]byte) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			secretByteStrings(v.Elem(), out)
		}
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			secretByteStrings(v.Field(i), out)
		}
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			if v.Len() >= 4 {
				*out = append(*out, v.Bytes())
			}
			return
		}
		for i := 0; i < v.Len(); i++ {
			secretByteStrings(v.Index(i), out)
		}
	}
}

func assertNoSecret(t *testing.T, what, out string, secrets [][]byte) {
	t.Helper()
	for _, s := range secrets {
		for _, form := range []string{string(s), hex.EncodeToString(s), strings.ToUpper(hex.EncodeToString(s)),
			base64.StdEncoding.EncodeToString(s), base64.RawStdEncoding.EncodeToString(s)} {
			if strings.Contains(out, form) {
				t.Errorf("%s: secret bytes %x appear in the output", what, s)
			}
		}
	}
}

func TestSensitiveNeverPrinted(t *testing.T) {
	reg := wire.MustRegistry(registry.Default.All(), []wire.MessageInfo{{
		Type: fakeSecretType, Name: "device.FakeSecretV1", Since: wire.V(1, 0), MaxSize: 300, Sensitive: true,
		New: func() wire.Message { return new(fakeSecret) },
	}})
	type sample struct {
		m       wire.Message
		secrets [][]byte
	}
	secret := []byte("hunter2-very-secret-key")
	samples := []sample{{&fakeSecret{Key: secret}, [][]byte{secret}}}
	nSensitive := 0
	for _, m := range registry.Samples() {
		mi, _ := registry.Default.Lookup(m.MessageType())
		if !mi.Sensitive {
			continue
		}
		nSensitive++
		var s [][]byte
		secretByteStrings(reflect.ValueOf(m), &s)
		samples = append(samples, sample{m, s})
	}
	t.Logf("%d sensitive samples from the registry, plus a test type", nSensitive)
	for _, s := range samples {
		frame := frameOf(t, s.m)
		body := s.m.AppendPostcard(nil)
		s.secrets = append(s.secrets, body)
		for _, args := range [][]string{{"--hex"}, {"--json", "--hex"}, {"--stream", "--json", "--hex"}} {
			r := runWith(reg, nil, append(args, hex.EncodeToString(frame))...)
			if r.code != 0 {
				t.Fatalf("%T %v: exit %d %s", s.m, args, r.code, r.stderr)
			}
			if !strings.Contains(r.stdout, "<redacted "+strconv.Itoa(len(body))+" bytes>") {
				t.Errorf("%T %v: no redaction marker:\n%s", s.m, args, r.stdout)
			}
			assertNoSecret(t, reflect.TypeOf(s.m).String(), r.stdout+r.stderr, s.secrets)
		}
	}
}

// TestGarbageNeverPanics feeds truncations and corruptions of every
// vector, and random bytes, through both decode paths.
func TestGarbageNeverPanics(t *testing.T) {
	var inputs [][]byte
	for _, v := range allVectors(t) {
		f, _ := v.Frame()
		for i := 0; i < len(f); i++ {
			inputs = append(inputs, f[:i])
			c := append([]byte(nil), f...)
			c[i] ^= 0xff
			inputs = append(inputs, c)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 300; i++ {
		b := make([]byte, rng.IntN(200))
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		inputs = append(inputs, b)
	}
	inputs = append(inputs, nil, []byte{0xff}, bytes.Repeat([]byte{0xff}, 11), []byte{0x80, 0x80, 0x80, 0x80, 0x04})
	failures := 0
	for _, in := range inputs {
		for _, args := range [][]string{{"-"}, {"--stream", "--json", "--hex", hex.EncodeToString(in)}} {
			if len(in) == 0 && args[0] != "-" {
				continue // an empty --hex means no input given
			}
			r := runWith(registry.Default, in, args...)
			checkNoCrash(t, r)
			if r.code != 0 && r.code != 1 {
				t.Fatalf("input %x: exit %d", in, r.code)
			}
			if r.code == 1 {
				failures++
				if r.stderr == "" {
					t.Fatalf("input %x: exit 1 without a message", in)
				}
			}
		}
	}
	if failures == 0 {
		t.Fatal("no garbage input failed to decode")
	}
	if r := runArgs("--hex", ""); r.code != 2 {
		t.Errorf("empty --hex: exit %d", r.code) // "" means the flag was not given
	}
	if r := runArgs("--hex", "00"); r.code != 1 || !strings.Contains(r.stderr, "frame 0") {
		t.Errorf("empty frame: exit %d %q", r.code, r.stderr)
	}
	if r := runArgs("--hex", "ff"+strings.Repeat("ff", 8)+"01"); r.code != 1 || !strings.Contains(r.stderr, "exceeds limit") {
		t.Errorf("huge frame: exit %d %q", r.code, r.stderr)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--hex", "00", "--file", "x"},
		{"--hex", "00", "extra"},
		{"--nope"},
		{"registry", "extra"},
		{"registry", "--nope"},
		{"vectors", "a", "b"},
	} {
		r := runArgs(args...)
		checkNoCrash(t, r)
		if r.code != 2 || !strings.Contains(r.stderr, "--help") {
			t.Errorf("%v: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
	if r := runArgs("--help"); r.code != 0 || !strings.HasPrefix(r.stdout, "usage:") {
		t.Errorf("--help: exit %d", r.code)
	}
	if r := runArgs("--file", filepath.Join(t.TempDir(), "missing")); r.code != 1 {
		t.Errorf("missing file: exit %d", r.code)
	}
	if r := runArgs("vectors", t.TempDir()); r.code != 1 || !strings.Contains(r.stderr, "no version directories") {
		t.Errorf("empty vector dir: exit %d %q", r.code, r.stderr)
	}
}

func TestRegistryCommand(t *testing.T) {
	all := registry.Default.All()
	r := runArgs("registry")
	if r.code != 0 {
		t.Fatal(r.stderr)
	}
	if lines := strings.Count(r.stdout, "\n"); lines != len(all)+1 {
		t.Errorf("%d lines for %d types", lines, len(all))
	}
	for _, mi := range all {
		if !strings.Contains(r.stdout, mi.Type.String()+"  ") || !strings.Contains(r.stdout, mi.Name) {
			t.Errorf("registry output lacks %s %s", mi.Type, mi.Name)
		}
	}
	r = runArgs("registry", "--json")
	var got []struct {
		Type, Family, Name, Since string
		MaxSize                   int `json:"max_size"`
		Sensitive                 bool
		TypeID                    uint64                        `json:"type_id"`
		SinceVersion              struct{ Major, Minor uint16 } `json:"since_version"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got) != len(all) {
		t.Fatalf("json: %v, %d entries", err, len(got))
	}
	for i, mi := range all {
		if got[i].Name != mi.Name || got[i].Type != mi.Type.String() || got[i].MaxSize != mi.MaxSize || got[i].Sensitive != mi.Sensitive ||
			got[i].TypeID != uint64(mi.Type) || got[i].SinceVersion.Major != mi.Since.Major || got[i].SinceVersion.Minor != mi.Since.Minor {
			t.Errorf("entry %d: %+v, want %s", i, got[i], mi.Name)
		}
	}
}

func TestVectorsCommandReportsBrokenVector(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "v1.0")
	v := allVectors(t)[0]
	v.FrameHex = v.FrameHex[:len(v.FrameHex)-2] + "ff"
	if err := vectors.WriteDir(dir, map[string][]vectors.Vector{"common": {v}}); err != nil {
		t.Fatal(err)
	}
	r := runArgs("vectors", filepath.Dir(dir))
	checkNoCrash(t, r)
	if r.code != 1 || !strings.Contains(r.stderr, v.Name) || !strings.Contains(r.stdout, "1 failed") {
		t.Errorf("exit %d stderr %q", r.code, r.stderr)
	}
}
