package registry

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

var update = flag.Bool("update", false, "rewrite docs/protocols/internal/registry.md from the registry")

const docPath = "../../docs/protocols/internal/registry.md"

func TestRegistryFamilies(t *testing.T) {
	fams := Families()
	if len(fams) == 0 || fams[0].Family != wire.FamilyCommon {
		t.Fatalf("first family must be common, got %v", fams)
	}
	for i, f := range fams {
		if i > 0 && fams[i-1].Family >= f.Family {
			t.Errorf("families out of order or duplicated: %s after %s", f.Family, fams[i-1].Family)
		}
		if int(f.Family) >= wire.NumFamilies {
			t.Errorf("family %d is not a wire.Family", f.Family)
		}
		if f.Samples == nil {
			t.Errorf("family %s has no Samples function", f.Name())
		}
		wantPkg := "forgeyard.dev/transport/wire/" + f.Name()
		if f.Family == wire.FamilyCommon {
			wantPkg = "forgeyard.dev/transport/wire"
		}
		for _, mi := range f.Messages {
			rt := reflect.TypeOf(mi.New())
			if rt.Kind() == reflect.Pointer {
				rt = rt.Elem()
			}
			if got := rt.PkgPath(); got != wantPkg {
				t.Errorf("%s: family %s message defined in package %s, want %s", mi.Name, f.Name(), got, wantPkg)
			}
			if mi.Type.Family() != f.Family {
				t.Errorf("%s: type %s belongs to family %s, registered under %s", mi.Name, mi.Type, mi.Type.Family(), f.Family)
			}
			if !strings.HasPrefix(mi.Name, f.Name()+".") {
				t.Errorf("%s: name must start with %q", mi.Name, f.Name()+".")
			}
		}
	}
}

func TestRegistryNamesAndTypesUnique(t *testing.T) {
	names := map[string]wire.MessageTypeId{}
	types := map[wire.MessageTypeId]string{}
	n := 0
	for _, f := range Families() {
		for _, mi := range f.Messages {
			n++
			if prev, dup := names[mi.Name]; dup {
				t.Errorf("name %s used by %s and %s", mi.Name, prev, mi.Type)
			}
			if prev, dup := types[mi.Type]; dup {
				t.Errorf("type %s used by %s and %s", mi.Type, prev, mi.Name)
			}
			names[mi.Name], types[mi.Type] = mi.Type, mi.Name
		}
	}
	if got := len(Default.All()); got != n {
		t.Errorf("Default holds %d types, families list %d", got, n)
	}
	for _, mi := range Default.All() {
		if mi.Since.Major == 0 || wire.Current.Less(mi.Since) {
			t.Errorf("%s: Since %s outside 1.0..%s", mi.Name, mi.Since, wire.Current)
		}
		// MaxSize 0 is an empty message (a unit struct).
		if mi.MaxSize < 0 || mi.MaxSize+wire.EnvelopeHeaderMaxSize > wire.MaxAnyFrame {
			t.Errorf("%s: MaxSize %d does not fit a frame", mi.Name, mi.MaxSize)
		}
		a, b := mi.New(), mi.New()
		// Zero-size values may share an address; only sized ones must not.
		if va, vb := reflect.ValueOf(a), reflect.ValueOf(b); va.Kind() == reflect.Pointer && va.Type().Elem().Size() > 0 && va.Pointer() == vb.Pointer() {
			t.Errorf("%s: New returns a shared value", mi.Name)
		}
	}
}

func TestRegistrySamplesCoverEveryType(t *testing.T) {
	seen := map[wire.MessageTypeId]int{}
	for _, f := range Families() {
		for _, m := range f.Samples() {
			ty := m.MessageType()
			if ty.Family() != f.Family {
				t.Errorf("family %s sample of type %s belongs to family %s", f.Name(), ty, ty.Family())
			}
			if _, ok := Default.Lookup(ty); !ok {
				t.Errorf("sample %T has unregistered type %s", m, ty)
			}
			seen[ty]++
		}
	}
	for _, mi := range Default.All() {
		if seen[mi.Type] == 0 {
			t.Errorf("%s (%s) has no sample", mi.Name, mi.Type)
		}
	}
	if a, b := len(Samples()), len(seen); a < b {
		t.Errorf("Samples() returned %d values for %d types", a, b)
	}
}

// TestRegistrySamplesEncode checks every sample against its registration:
// it validates, its body fits MaxSize, it decodes through Default back to
// the same value and the same bytes, and Samples is deterministic.
func TestRegistrySamplesEncode(t *testing.T) {
	first, second := Samples(), Samples()
	if len(first) != len(second) {
		t.Fatalf("Samples not deterministic: %d then %d values", len(first), len(second))
	}
	for i, m := range first {
		mi, ok := Default.Lookup(m.MessageType())
		if !ok {
			t.Errorf("sample %d: %T unregistered", i, m)
			continue
		}
		name := fmt.Sprintf("%s#%d", mi.Name, i)
		if reflect.TypeOf(m) != reflect.TypeOf(mi.New()) {
			t.Errorf("%s: sample is %T, registry makes %T", name, m, mi.New())
		}
		if err := m.Validate(); err != nil {
			t.Errorf("%s: sample does not validate: %v", name, err)
		}
		body := m.AppendPostcard(nil)
		if len(body) > mi.MaxSize {
			t.Errorf("%s: body is %d bytes, MaxSize %d", name, len(body), mi.MaxSize)
		}
		if again := second[i].AppendPostcard(nil); !bytes.Equal(body, again) {
			t.Errorf("%s: Samples not deterministic:\n%x\n%x", name, body, again)
		}
		payload := wire.AppendMessage(nil, m)
		d := postcard.NewDecoder(payload)
		got, err := Default.DecodeMessage(&d)
		if err != nil {
			t.Errorf("%s: decode: %v", name, err)
			continue
		}
		if !reflect.DeepEqual(normalize(got), normalize(m)) {
			t.Errorf("%s: decoded value differs:\n got %#v\nwant %#v", name, got, m)
		}
		if re := wire.AppendMessage(nil, got); !bytes.Equal(re, payload) {
			t.Errorf("%s: re-encoding differs:\n got %x\nwant %x", name, re, payload)
		}
	}
}

// normalize re-decodes m so that nil and empty slices compare equal: a
// sample may hold an empty non-nil slice that decodes as nil.
func normalize(m wire.Message) wire.Message {
	mi, ok := Default.Lookup(m.MessageType())
	if !ok {
		return m
	}
	n := mi.New()
	d := postcard.NewDecoder(m.AppendPostcard(nil))
	n.DecodePostcard(&d)
	if d.Finish() != nil {
		return m
	}
	return n
}

// TestRegistryDoc keeps docs/protocols/internal/registry.md equal to the
// registry. Run `go test ./wire/registry -run Registry -update` after
// registering a message.
func TestRegistryDoc(t *testing.T) {
	want := renderDoc()
	if *update {
		if err := os.MkdirAll(filepath.Dir(docPath), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(docPath, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatalf("%v\nhint: go test ./wire/registry -run Registry -update", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is stale: it does not match the registry (first difference at line %d)\nhint: go test ./wire/registry -run Registry -update",
			docPath, firstDiffLine(got, want))
	}
}

func firstDiffLine(a, b []byte) int {
	la, lb := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := range la {
		if i >= len(lb) || la[i] != lb[i] {
			return i + 1
		}
	}
	return len(la) + 1
}

func renderDoc() []byte {
	var b bytes.Buffer
	b.WriteString("# Message registry\n\n")
	b.WriteString("<!-- Code generated by `go test ./wire/registry -run Registry -update`. DO NOT EDIT. -->\n\n")
	b.WriteString("This table is generated from `registry.Default`, the registry every Forgeyard\n")
	b.WriteString("transport decodes envelopes with. A message's type id is `family << 8 | variant`;\n")
	b.WriteString("on the wire the payload carries `varint(family) ‖ varint(variant)` before the body\n")
	b.WriteString("(see [framing.md](framing.md)). Numbers are explicit and stable: a number is never\n")
	b.WriteString("renumbered or reused, and a changed message gets a new name and number (`...V2`),\n")
	b.WriteString("see [compatibility.md](compatibility.md).\n\n")
	b.WriteString("- **Since** is the first protocol version whose peers may send the message.\n")
	b.WriteString("- **Max body** bounds the encoded message body (after the two enum varints); a\n")
	b.WriteString("  receiver rejects a longer body before decoding it.\n")
	b.WriteString("- **Sensitive** messages carry secret material. They are never logged or printed;\n")
	b.WriteString("  `forgeyard-protocol-inspect` shows only their size.\n\n")

	b.WriteString("## Families\n\n")
	b.WriteString("| Number | Family | Messages |\n|-------:|--------|---------:|\n")
	registered := map[wire.Family]int{}
	for _, f := range Families() {
		registered[f.Family] = len(f.Messages)
	}
	for fam := wire.Family(0); fam < wire.NumFamilies; fam++ {
		n, ok := registered[fam]
		count := fmt.Sprint(n)
		if !ok {
			count = "not in this build"
		}
		fmt.Fprintf(&b, "| %d | %s | %s |\n", fam, fam, count)
	}

	b.WriteString("\n## Messages\n\n")
	b.WriteString("| Type | Family | Variant | Name | Since | Max body (bytes) | Sensitive |\n")
	b.WriteString("|------|--------|--------:|------|-------|-----------------:|-----------|\n")
	for _, mi := range Default.All() {
		sens := "no"
		if mi.Sensitive {
			sens = "**yes**"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %d | `%s` | %s | %d | %s |\n",
			mi.Type, mi.Type.Family(), mi.Type.Variant(), mi.Name, mi.Since, mi.MaxSize, sens)
	}
	return b.Bytes()
}
