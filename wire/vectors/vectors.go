// Package vectors holds the golden vectors of the wire protocol (§165–166)
// and the code that generates, reads and checks them.
//
// Layout: testdata/v<major>.<minor>/<family>.json, one directory per
// protocol version, one file per family. Each file is a JSON array of
// Vector. body_hex is the Postcard body of a registry sample
// (Message.AppendPostcard); frame_hex is a complete frame, varint(len) ‖
// envelope, around that body with the fixed envelope of FixedEnvelope.
//
// The vectors of the current protocol version are regenerated from
// registry.Samples by the package tests, which fail on any difference.
// A directory holding a file named RELEASED is frozen: the tests refuse
// to rewrite it, and every vector in every committed directory must still
// decode, validate and re-encode to the same bytes with the current
// decoder. A wire change therefore needs a new message version, never an
// edit of a released vector (§55, §162).
package vectors

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/oklog/ulid/v2"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/registry"
)

// ReleasedMarker is the name of the file that freezes a version directory.
const ReleasedMarker = "RELEASED"

// DefaultDir is the vector directory relative to the module root.
const DefaultDir = "wire/vectors/testdata"

// Vector is one golden vector. All fields are strings so that the files
// diff well and read the same in any language.
type Vector struct {
	Name     string `json:"name"`      // "<message name>#<n>": n-th sample of that type
	Type     string `json:"type"`      // MessageTypeId, "0x0106"
	Version  string `json:"version"`   // MessageInfo.Since, "1.0"
	BodyHex  string `json:"body_hex"`  // the message body, lowercase hex
	FrameHex string `json:"frame_hex"` // varint(len) ‖ envelope, lowercase hex
}

// Fixed envelope fields of every vector frame.
var (
	// FixedSentAtMs is 2026-01-01T00:00:00Z in unix milliseconds.
	FixedSentAtMs uint64 = 1767225600000
	// FixedMessageID is a ULID at FixedSentAtMs with entropy "message-id".
	FixedMessageID = wire.MessageId{ULID: ulid.MustNew(FixedSentAtMs, strings.NewReader("message-id"))}
	// FixedCorrelationID is a ULID at FixedSentAtMs with entropy "correlate!".
	FixedCorrelationID = wire.CorrelationId{ULID: ulid.MustNew(FixedSentAtMs, strings.NewReader("correlate!"))}
)

// FixedEnvelope returns the envelope every vector frame uses: protocol p,
// FixedMessageID, FixedCorrelationID, FixedSentAtMs, no trace context.
func FixedEnvelope(p wire.ProtocolVersion, m wire.Message) *wire.Envelope {
	return &wire.Envelope{
		Protocol:       p,
		MessageID:      FixedMessageID,
		HasCorrelation: true,
		CorrelationID:  FixedCorrelationID,
		SentAtMs:       FixedSentAtMs,
		Payload:        m,
	}
}

// DirName returns the directory name of protocol version p, "v1.0".
func DirName(p wire.ProtocolVersion) string { return "v" + p.String() }

// Generate builds the vectors of protocol version p from registry.Samples,
// keyed by family name ("agent"). Within a file vectors follow the family's
// sample order.
func Generate(p wire.ProtocolVersion) (map[string][]Vector, error) {
	out := map[string][]Vector{}
	for _, f := range registry.Families() {
		count := map[wire.MessageTypeId]int{}
		var vs []Vector
		for _, m := range f.Samples() {
			mi, ok := registry.Default.Lookup(m.MessageType())
			if !ok {
				return nil, fmt.Errorf("vectors: sample %T has unregistered type %s", m, m.MessageType())
			}
			n := count[mi.Type]
			count[mi.Type]++
			frame, err := wire.AppendEnvelopeFrame(nil, wire.MaxAnyFrame, FixedEnvelope(p, m))
			if err != nil {
				return nil, fmt.Errorf("vectors: %s: %w", mi.Name, err)
			}
			vs = append(vs, Vector{
				Name:     mi.Name + "#" + strconv.Itoa(n),
				Type:     mi.Type.String(),
				Version:  mi.Since.String(),
				BodyHex:  hex.EncodeToString(m.AppendPostcard(nil)),
				FrameHex: hex.EncodeToString(frame),
			})
		}
		out[f.Name()] = vs
	}
	return out, nil
}

// Marshal renders vs as the committed file format: an indented JSON array
// ending in a newline.
func Marshal(vs []Vector) []byte {
	if vs == nil {
		vs = []Vector{}
	}
	b, err := json.MarshalIndent(vs, "", "  ")
	if err != nil { // cannot happen: only strings
		panic(err)
	}
	return append(b, '\n')
}

// ErrReleased is returned by WriteDir for a directory holding a
// ReleasedMarker file.
var ErrReleased = errors.New("vectors: directory is RELEASED; released vectors are frozen — add a new message version instead")

// WriteDir writes one file per family into dir (created if needed) and
// removes .json files of families no longer present. It refuses, with
// ErrReleased and without touching anything, when dir is released.
func WriteDir(dir string, files map[string][]Vector) error {
	if _, err := os.Stat(filepath.Join(dir, ReleasedMarker)); err == nil {
		return fmt.Errorf("%w (%s)", ErrReleased, dir)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	old, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return err
	}
	for _, p := range old {
		if _, keep := files[strings.TrimSuffix(filepath.Base(p), ".json")]; !keep {
			if err := os.Remove(p); err != nil {
				return err
			}
		}
	}
	for fam, vs := range files {
		if err := os.WriteFile(filepath.Join(dir, fam+".json"), Marshal(vs), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// MaxFileSize bounds a vector file read by ReadDir.
const MaxFileSize = 16 << 20

// ReadDir reads every <family>.json file of one version directory, keyed by
// family name.
func ReadDir(dir string) (map[string][]Vector, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	out := map[string][]Vector{}
	for _, p := range paths {
		vs, err := ReadFile(p)
		if err != nil {
			return nil, err
		}
		out[strings.TrimSuffix(filepath.Base(p), ".json")] = vs
	}
	return out, nil
}

// ReadFile reads one vector file. Unknown JSON fields are an error, so a
// typo cannot silently drop a field from the check.
func ReadFile(path string) ([]Vector, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("vectors: %s: larger than %d bytes", path, MaxFileSize)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var vs []Vector
	if err := dec.Decode(&vs); err != nil {
		return nil, fmt.Errorf("vectors: %s: %w", path, err)
	}
	return vs, nil
}

// VersionDirs returns the version directories (v<major>.<minor>) under
// root, ordered by version.
func VersionDirs(root string) ([]string, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	type vd struct {
		v    wire.ProtocolVersion
		path string
	}
	var dirs []vd
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		v, ok := ParseDirName(e.Name())
		if !ok {
			continue
		}
		dirs = append(dirs, vd{v, filepath.Join(root, e.Name())})
	}
	sort.Slice(dirs, func(i, j int) bool { return dirs[i].v.Less(dirs[j].v) })
	out := make([]string, len(dirs))
	for i, d := range dirs {
		out[i] = d.path
	}
	return out, nil
}

// ParseDirName parses "v1.0" into a ProtocolVersion.
func ParseDirName(name string) (wire.ProtocolVersion, bool) {
	rest, ok := strings.CutPrefix(name, "v")
	if !ok {
		return wire.ProtocolVersion{}, false
	}
	maj, min, ok := strings.Cut(rest, ".")
	if !ok {
		return wire.ProtocolVersion{}, false
	}
	a, err1 := strconv.ParseUint(maj, 10, 16)
	b, err2 := strconv.ParseUint(min, 10, 16)
	if err1 != nil || err2 != nil {
		return wire.ProtocolVersion{}, false
	}
	return wire.V(uint16(a), uint16(b)), true
}

// Released reports whether dir holds a ReleasedMarker file.
func Released(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, ReleasedMarker))
	return err == nil
}

// Frame returns the decoded frame bytes of v.
func (v Vector) Frame() ([]byte, error) { return hex.DecodeString(v.FrameHex) }

// Check decodes v's frame with r and verifies it: exactly one frame,
// the envelope decodes, the payload has v's type, name and version and
// passes Validate, its body equals body_hex, and re-encoding the envelope
// reproduces frame_hex byte for byte. It returns the decoded envelope.
func Check(v Vector, r *wire.Registry) (*wire.Envelope, error) {
	fail := func(format string, args ...any) (*wire.Envelope, error) {
		return nil, fmt.Errorf("vector %s: %s", v.Name, fmt.Sprintf(format, args...))
	}
	body, err := hex.DecodeString(v.BodyHex)
	if err != nil {
		return fail("body_hex: %v", err)
	}
	frame, err := hex.DecodeString(v.FrameHex)
	if err != nil {
		return fail("frame_hex: %v", err)
	}
	fr := wire.NewFrameReader(bytes.NewReader(frame), wire.MaxAnyFrame)
	fb, err := fr.Next()
	if err != nil {
		return fail("frame: %v", err)
	}
	fb = append([]byte(nil), fb...)
	if _, err := fr.Next(); err != io.EOF {
		return fail("frame_hex holds more than one frame")
	}
	env, err := wire.DecodeEnvelope(fb, r)
	if err != nil {
		return fail("decode: %v", err)
	}
	mi, _ := r.Lookup(env.Payload.MessageType())
	if got := mi.Type.String(); got != v.Type {
		return fail("decoded type %s, vector says %s", got, v.Type)
	}
	if name, _, _ := strings.Cut(v.Name, "#"); name != mi.Name {
		return fail("decoded message %s", mi.Name)
	}
	if got := mi.Since.String(); got != v.Version {
		return fail("registry says since %s, vector says %s", got, v.Version)
	}
	if err := env.Payload.Validate(); err != nil {
		return fail("validate: %v", err)
	}
	if got := env.Payload.AppendPostcard(nil); !bytes.Equal(got, body) {
		return fail("body re-encodes as %x, want %s", got, v.BodyHex)
	}
	re, err := wire.AppendEnvelopeFrame(nil, wire.MaxAnyFrame, env)
	if err != nil {
		return fail("re-encode frame: %v", err)
	}
	if !bytes.Equal(re, frame) {
		return fail("frame re-encodes as %x, want %s", re, v.FrameHex)
	}
	return env, nil
}

// Diff compares committed vectors with freshly generated ones and describes
// every difference, one line per vector, naming the vector and the field.
func Diff(committed, generated []Vector) []string {
	var out []string
	byName := map[string]Vector{}
	for _, v := range committed {
		byName[v.Name] = v
	}
	seen := map[string]bool{}
	for _, g := range generated {
		seen[g.Name] = true
		c, ok := byName[g.Name]
		switch {
		case !ok:
			out = append(out, g.Name+": new vector, not committed")
		case c.Type != g.Type:
			out = append(out, fmt.Sprintf("%s: type changed %s → %s", g.Name, c.Type, g.Type))
		case c.Version != g.Version:
			out = append(out, fmt.Sprintf("%s: version changed %s → %s", g.Name, c.Version, g.Version))
		case c.BodyHex != g.BodyHex:
			out = append(out, fmt.Sprintf("%s: body changed\n  committed %s\n  now       %s", g.Name, c.BodyHex, g.BodyHex))
		case c.FrameHex != g.FrameHex:
			out = append(out, fmt.Sprintf("%s: frame changed\n  committed %s\n  now       %s", g.Name, c.FrameHex, g.FrameHex))
		}
	}
	for _, c := range committed {
		if !seen[c.Name] {
			out = append(out, c.Name+": committed vector no longer generated")
		}
	}
	return out
}

// ReleasedSums returns the content of a ReleasedMarker file for dir: a
// comment line, then "sha256-hex  file" for every .json file of dir in
// name order. A released directory's marker holds these sums, so any change
// to a released vector file (or a file added or removed) is detected by
// comparing them again (see CheckReleased).
func ReleasedSums(dir string) (string, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return "", err
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("# released wire vectors: frozen. sha256 of each file; never edit, regenerate or remove them.\n")
	for _, n := range names {
		data, err := os.ReadFile(n)
		if err != nil {
			return "", err
		}
		sum := sha256.Sum256(data)
		fmt.Fprintf(&b, "%x  %s\n", sum, filepath.Base(n))
	}
	return b.String(), nil
}

// CheckReleased compares the sums recorded in dir's ReleasedMarker with the
// files' current contents. It returns one message per difference (a file
// changed, added or removed); none means the released vectors are intact.
func CheckReleased(dir string) ([]string, error) {
	rec, err := os.ReadFile(filepath.Join(dir, ReleasedMarker))
	if err != nil {
		return nil, err
	}
	now, err := ReleasedSums(dir)
	if err != nil {
		return nil, err
	}
	parse := func(s string) map[string]string {
		m := map[string]string{}
		for _, line := range strings.Split(s, "\n") {
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			sum, name, _ := strings.Cut(line, "  ")
			m[name] = sum
		}
		return m
	}
	want, got := parse(string(rec)), parse(now)
	var out []string
	for _, name := range slices.Sorted(maps.Keys(want)) {
		switch g, ok := got[name]; {
		case !ok:
			out = append(out, fmt.Sprintf("%s/%s: released file removed", dir, name))
		case g != want[name]:
			out = append(out, fmt.Sprintf("%s/%s: released file changed (sha256 %s, released %s)", dir, name, g, want[name]))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[name]; !ok {
			out = append(out, fmt.Sprintf("%s/%s: file added to a released directory", dir, name))
		}
	}
	if len(want) == 0 {
		out = append(out, fmt.Sprintf("%s/%s lists no files", dir, ReleasedMarker))
	}
	return out, nil
}
