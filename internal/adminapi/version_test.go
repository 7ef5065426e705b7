package adminapi

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"forgeyard.dev/transport/wire"
)

// TestVersionsAsNumbers: every version string of the admin JSON has its
// numeric form beside it, equal to what wire.ParseVersion reads, and the
// JSON still decodes into the Go type unchanged. The string fields are
// found by reflection (a json tag naming a protocol or version), not
// listed by hand.
func TestVersionsAsNumbers(t *testing.T) {
	const v = "1.2"
	want := map[string]any{"major": float64(1), "minor": float64(2)}
	for _, val := range []any{
		Session{Protocol: v},
		Runner{Protocol: v},
		VersionCount{Protocol: v, Agents: 3},
		Range{Min: v, Max: v},
		Protocols{Supported: Range{Min: v, Max: v}, Configured: Range{Min: v, Max: v}, MinProtocol: v, Agents: []VersionCount{{Protocol: v}}},
	} {
		b, err := json.Marshal(val)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		rt := reflect.TypeOf(val)
		for i := range rt.NumField() {
			f := rt.Field(i)
			tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if f.Type.Kind() != reflect.String || (!strings.Contains(tag, "protocol") && tag != "min" && tag != "max") {
				continue
			}
			num := tag + "_version"
			if tag == "protocol" {
				num = "protocol_version"
			}
			if !reflect.DeepEqual(m[num], want) {
				t.Errorf("%s: %s = %v beside %s %q, want %v", rt.Name(), num, m[num], tag, v, want)
			}
		}
		back := reflect.New(rt)
		if err := json.Unmarshal(b, back.Interface()); err != nil || !reflect.DeepEqual(back.Elem().Interface(), val) {
			t.Errorf("%s does not round-trip: %v %+v", rt.Name(), err, back.Elem().Interface())
		}
	}
	if _, err := wire.ParseVersion(v); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(Session{})
	if strings.Contains(string(b), "protocol_version") {
		t.Errorf("an empty protocol got a numeric form: %s", b)
	}
}
