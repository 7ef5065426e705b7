package vectors

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/registry"
)

var update = flag.Bool("update", false, "rewrite the vectors of the current protocol version (refused for RELEASED directories)")

const testdata = "testdata"

const frozenHint = "wire encoding changed; released vectors are frozen — add a new message version instead " +
	"(for an unreleased version: go test ./wire/vectors -run Vectors -update)"

// TestVectorsCurrent regenerates the vectors of wire.Current from the
// registry samples and compares them with the committed files.
func TestVectorsCurrent(t *testing.T) {
	gen, err := Generate(wire.Current)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(testdata, DirName(wire.Current))
	if *update {
		if err := WriteDir(dir, gen); err != nil {
			t.Fatal(err)
		}
		return
	}
	committed, err := ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range sortedKeys(gen) {
		got, ok := committed[fam]
		if !ok {
			t.Errorf("%s/%s.json missing\nhint: %s", dir, fam, frozenHint)
			continue
		}
		for _, d := range Diff(got, gen[fam]) {
			t.Errorf("%s/%s.json: %s", dir, fam, d)
		}
	}
	for fam := range committed {
		if _, ok := gen[fam]; !ok {
			t.Errorf("%s/%s.json: family no longer registered", dir, fam)
		}
	}
	if t.Failed() {
		t.Log("hint: " + frozenHint)
	}
}

// TestVectorsDecodeCommitted decodes every vector of every committed version
// directory, released or not, with the current decoder.
func TestVectorsDecodeCommitted(t *testing.T) {
	dirs, err := VersionDirs(testdata)
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatal("no vector directories under testdata")
	}
	total := 0
	for _, dir := range dirs {
		files, err := ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Errorf("%s: no vector files", dir)
		}
		dv, _ := ParseDirName(filepath.Base(dir))
		for fam, vs := range files {
			for _, v := range vs {
				total++
				env, err := Check(v, registry.Default)
				if err != nil {
					t.Errorf("%s/%s.json: %v", dir, fam, err)
					if Released(dir) {
						t.Log("a RELEASED vector no longer decodes: the current decoder broke compatibility")
					}
					continue
				}
				if env.Protocol != dv {
					t.Errorf("%s: envelope protocol %s in directory %s", v.Name, env.Protocol, dir)
				}
				if fam != env.Payload.MessageType().Family().String() {
					t.Errorf("%s: in %s.json, belongs to family %s", v.Name, fam, env.Payload.MessageType().Family())
				}
			}
		}
	}
	t.Logf("%d vectors in %d version directories decode", total, len(dirs))
}

func TestWriteDirRefusesReleased(t *testing.T) {
	dir := t.TempDir()
	files := map[string][]Vector{"common": {{Name: "x#0", Type: "0x0001", Version: "1.0"}}}
	if err := WriteDir(dir, files); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(filepath.Join(dir, "common.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ReleasedMarker), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err = WriteDir(dir, map[string][]Vector{"common": nil})
	if !errors.Is(err, ErrReleased) {
		t.Fatalf("WriteDir on a released directory: %v, want ErrReleased", err)
	}
	after, err := os.ReadFile(filepath.Join(dir, "common.json"))
	if err != nil || string(after) != string(before) {
		t.Fatalf("released file changed: %v\n%s", err, after)
	}
}

func TestWriteDirRemovesStaleFamilies(t *testing.T) {
	dir := t.TempDir()
	if err := WriteDir(dir, map[string][]Vector{"common": nil, "agent": nil}); err != nil {
		t.Fatal(err)
	}
	if err := WriteDir(dir, map[string][]Vector{"common": nil}); err != nil {
		t.Fatal(err)
	}
	files, err := ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := files["agent"]; ok || len(files) != 1 {
		t.Fatalf("files after rewrite: %v", files)
	}
}

func TestCheckDetectsTampering(t *testing.T) {
	gen, err := Generate(wire.Current)
	if err != nil {
		t.Fatal(err)
	}
	v := gen["common"][0]
	if _, err := Check(v, registry.Default); err != nil {
		t.Fatalf("fresh vector: %v", err)
	}
	cases := map[string]func(*Vector){
		"body":    func(v *Vector) { v.BodyHex = v.BodyHex[:len(v.BodyHex)-2] + "00" },
		"frame":   func(v *Vector) { v.FrameHex += "00" },
		"type":    func(v *Vector) { v.Type = "0x0002" },
		"name":    func(v *Vector) { v.Name = "common.Other#0" },
		"version": func(v *Vector) { v.Version = "1.1" },
		"hex":     func(v *Vector) { v.FrameHex = "zz" },
	}
	for name, mutate := range cases {
		w := v
		mutate(&w)
		if _, err := Check(w, registry.Default); err == nil {
			t.Errorf("%s: tampered vector passed Check", name)
		}
	}
}

func TestParseDirName(t *testing.T) {
	for in, want := range map[string]bool{"v1.0": true, "v12.3": true, "1.0": false, "v1": false, "v1.x": false, "v70000.0": false} {
		if _, ok := ParseDirName(in); ok != want {
			t.Errorf("ParseDirName(%q) ok=%v", in, ok)
		}
	}
	if v, _ := ParseDirName(DirName(wire.V(2, 7))); v != wire.V(2, 7) {
		t.Errorf("round trip: %v", v)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

var release = flag.String("release", "", "mark the vectors of this protocol version (e.g. 1.0) RELEASED: write the RELEASED file with their sums")

// TestReleasedVectorsFrozen checks every RELEASED directory against the
// sums its marker recorded at release: a changed, added or removed vector
// file fails. Together with TestVectorsDecodeCommitted (every released
// vector decodes and re-encodes identically with the current decoder) this
// holds the current build to every release it claims to support.
func TestReleasedVectorsFrozen(t *testing.T) {
	if *release != "" {
		v, err := wire.ParseVersion(*release)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(testdata, DirName(v))
		if Released(dir) {
			t.Fatalf("%s is already RELEASED", dir)
		}
		sums, err := ReleasedSums(dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ReleasedMarker), []byte(sums), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dirs, err := VersionDirs(testdata)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, dir := range dirs {
		if !Released(dir) {
			continue
		}
		n++
		diffs, err := CheckReleased(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range diffs {
			t.Error(d + "\nhint: " + frozenHint)
		}
	}
	if n == 0 {
		t.Fatal("no RELEASED vector directory: v1.0 shipped with v0.1.0")
	}
	if !wire.Supported.Contains(wire.V(1, 0)) {
		t.Fatal("wire.Supported dropped 1.0 although its vectors are released; drop them together with the manifest entry")
	}
}

func TestCheckReleasedDetectsChanges(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"a.json", "b.json"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("[]\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sums, err := ReleasedSums(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ReleasedMarker), []byte(sums), 0o644); err != nil {
		t.Fatal(err)
	}
	if d, err := CheckReleased(dir); err != nil || len(d) != 0 {
		t.Fatalf("intact directory: %v %v", d, err)
	}
	_ = os.WriteFile(filepath.Join(dir, "a.json"), []byte("[ ]\n"), 0o644)
	_ = os.Remove(filepath.Join(dir, "b.json"))
	_ = os.WriteFile(filepath.Join(dir, "c.json"), []byte("[]\n"), 0o644)
	d, err := CheckReleased(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a.json: released file changed", "b.json: released file removed", "c.json: file added"}
	if len(d) != len(want) {
		t.Fatalf("differences %q, want %d", d, len(want))
	}
	for i, w := range want {
		if !strings.Contains(d[i], w) {
			t.Errorf("difference %d = %q, want it to contain %q", i, d[i], w)
		}
	}
}
