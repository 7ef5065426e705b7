package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
	"forgeyard.dev/transport/wire/registry"
)

// TestJSONCarriesEveryField (issue 27 item 3): for every golden vector the
// inspector's --json output carries every exported field of the decoded Go
// value, with its value: numbers as numbers (exact, also above 2^53),
// strings, booleans, byte strings as hex, lists item by item, and types
// that print themselves (ids, digests, enums) by their String form.
// Redacting types (GoString/Format) and Sensitive messages stay redacted.
func TestJSONCarriesEveryField(t *testing.T) {
	fieldsChecked := 0
	for _, v := range allVectors(t) {
		frame, err := hex.DecodeString(v.FrameHex)
		if err != nil {
			t.Fatal(err)
		}
		body, _, err := nextFrame(frame, wire.MaxAnyFrame)
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		d := postcard.NewDecoder(body)
		var env wire.Envelope
		env.DecodeHeader(&d)
		m, err := registry.Default.DecodeMessage(&d)
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		r := runArgs("--json", "--hex", v.FrameHex)
		dec := json.NewDecoder(strings.NewReader(r.stdout))
		dec.UseNumber()
		var got struct {
			Frames []map[string]any `json:"frames"`
		}
		if err := dec.Decode(&got); err != nil || len(got.Frames) != 1 {
			t.Fatalf("%s: %v\n%s", v.Name, err, r.stdout)
		}
		f := got.Frames[0]
		compare(t, v.Name+".protocol", reflect.ValueOf(env.Protocol), f["protocol"], &fieldsChecked)
		if mi, _ := registry.Default.Lookup(m.MessageType()); mi.Sensitive {
			continue
		}
		compare(t, v.Name+".payload", reflect.ValueOf(m), f["payload"], &fieldsChecked)
	}
	if fieldsChecked < 1000 {
		t.Fatalf("only %d fields compared: the walk is not reaching the payloads", fieldsChecked)
	}
	t.Logf("%d fields compared", fieldsChecked)
}

// compare checks the JSON value j against the Go value v.
func compare(t *testing.T, path string, v reflect.Value, j any, n *int) {
	t.Helper()
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			if j != nil {
				t.Errorf("%s: JSON %v for a nil value", path, j)
			}
			return
		}
		v = v.Elem()
	}
	*n++
	ty := v.Type()
	if s, ok := stringerOf(v); ok && (v.Kind() != reflect.Struct || isNewtype(ty) || redactsItself(ty)) {
		if js, ok := j.(string); !ok || js != s {
			t.Errorf("%s (%s): JSON %#v, want its String form %q", path, ty, j, s)
		}
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		o, ok := j.(map[string]any)
		if !ok {
			t.Errorf("%s (%s): JSON %#v, want an object of its fields", path, ty, j)
			return
		}
		for i := 0; i < ty.NumField(); i++ {
			fd := ty.Field(i)
			if !fd.IsExported() {
				continue
			}
			jv, present := o[fd.Name]
			if !present {
				t.Errorf("%s: field %s missing from the JSON", path, fd.Name)
				continue
			}
			compare(t, path+"."+fd.Name, v.Field(i), jv, n)
		}
	case reflect.Slice, reflect.Array:
		if ty.Elem().Kind() == reflect.Uint8 {
			b := make([]byte, v.Len())
			reflect.Copy(reflect.ValueOf(b), v)
			if js, ok := j.(string); !ok || js != hex.EncodeToString(b) {
				t.Errorf("%s: JSON %#v, want hex %x", path, j, b)
			}
			return
		}
		l, ok := j.([]any)
		if !ok || len(l) != v.Len() {
			t.Errorf("%s: JSON %#v, want a list of %d", path, j, v.Len())
			return
		}
		for i := range v.Len() {
			compare(t, fmt.Sprintf("%s[%d]", path, i), v.Index(i), l[i], n)
		}
	case reflect.Map:
		o, ok := j.(map[string]any)
		if !ok || len(o) != v.Len() {
			t.Errorf("%s: JSON %#v, want an object of %d entries", path, j, v.Len())
		}
	case reflect.Bool:
		if jb, ok := j.(bool); !ok || jb != v.Bool() {
			t.Errorf("%s: JSON %#v, want %v", path, j, v.Bool())
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		want := fmt.Sprint(v.Interface())
		if jn, ok := j.(json.Number); !ok || jn.String() != want {
			t.Errorf("%s: JSON %#v, want the number %s", path, j, want)
		}
	case reflect.String:
		if js, ok := j.(string); !ok || js != v.String() {
			t.Errorf("%s: JSON %#v, want %q", path, j, v.String())
		}
	case reflect.Float32, reflect.Float64:
		if _, ok := j.(json.Number); !ok {
			t.Errorf("%s: JSON %#v, want a number", path, j)
		}
	default:
		t.Errorf("%s: unexpected kind %s", path, v.Kind())
	}
}

// redactsItself is the test's own rule (not the renderer's): a struct that
// formats itself through GoString or Format hides fields on purpose; any
// other struct must show all of them.
func redactsItself(t reflect.Type) bool {
	for _, it := range []reflect.Type{reflect.TypeFor[fmt.GoStringer](), reflect.TypeFor[fmt.Formatter]()} {
		if t.Implements(it) || reflect.PointerTo(t).Implements(it) {
			return true
		}
	}
	return false
}
