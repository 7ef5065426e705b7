package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// The inspector turns decoded wire values into a small tree of ordered
// objects, lists and scalars by reflection, then prints that tree either as
// indented text or as JSON. Reflection is fine here: this is a diagnostic
// tool, not a hot path.

// obj is a JSON object that keeps its field order.
type obj []kv

type kv struct {
	K string
	V any
}

func (o obj) MarshalJSON() ([]byte, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := marshalJSON(f.K)
		b.Write(k)
		b.WriteByte(':')
		v, err := marshalJSON(f.V)
		if err != nil {
			return nil, err
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return []byte(b.String()), nil
}

// marshalJSON is json.Marshal without HTML escaping, so that "<redacted N
// bytes>" reads as written.
func marshalJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// enumVal is an enum: JSON shows the name, text shows "Name (n)".
type enumVal struct {
	Name string
	N    string
}

func (e enumVal) MarshalJSON() ([]byte, error) { return marshalJSON(e.Name) }

// bytesVal is a byte string: JSON shows lowercase hex, text shows the length,
// hex (truncated) and, when printable, the text.
type bytesVal []byte

func (b bytesVal) MarshalJSON() ([]byte, error) { return json.Marshal(hex.EncodeToString(b)) }

// textVal is already formatted text (ids, digests, redactions).
type textVal string

const (
	maxDepth     = 24
	maxListItems = 4096
	textHexLimit = 64
)

var (
	stringerType   = reflect.TypeFor[fmt.Stringer]()
	goStringerType = reflect.TypeFor[fmt.GoStringer]()
	formatterType  = reflect.TypeFor[fmt.Formatter]()
	logValuerType  = reflect.TypeFor[slog.LogValuer]()
	timeType       = reflect.TypeFor[time.Time]()
	durationType   = reflect.TypeFor[time.Duration]()
)

// tree converts v to the printable tree.
//
// A value whose type has a String method prints through it when it is not a
// struct (identifiers, digests, enums, redacting byte types such as
// agent.SecretBytes), when it is a one-field newtype struct (RunnerId), or
// when it also implements GoString, Format or slog.LogValuer: such a type
// controls its own printing, usually to redact, and is never expanded.
// Other structs are expanded field by field (exported fields only).
func tree(v reflect.Value, depth int) any {
	if depth > maxDepth {
		return textVal("…")
	}
	switch v.Kind() {
	case reflect.Invalid:
		return nil
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return tree(v.Elem(), depth+1)
	}
	t := v.Type()
	switch t {
	case timeType:
		return textVal(v.Interface().(time.Time).UTC().Format(time.RFC3339Nano))
	case durationType:
		return textVal(v.Interface().(time.Duration).String())
	}
	if s, ok := stringerOf(v); ok {
		switch v.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			return enumVal{Name: s, N: strconv.FormatInt(v.Int(), 10)}
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
			return enumVal{Name: s, N: strconv.FormatUint(v.Uint(), 10)}
		case reflect.Struct:
			if isNewtype(t) || redacting(t) {
				return textVal(s)
			}
			if selfPrinting(t) {
				// A short String form (CasObjectRef "sha256:<hex>",
				// ProtocolVersion "1.2") that drops fields: text prints
				// it, JSON every field (machine-readable output is
				// lossless).
				return structVal{Text: s, Fields: fields(v, depth)}
			}
		default:
			return textVal(s)
		}
	}
	switch v.Kind() {
	case reflect.Struct:
		return fields(v, depth)
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			b := make([]byte, v.Len())
			reflect.Copy(reflect.ValueOf(b), v)
			return bytesVal(b)
		}
		n := v.Len()
		if v.Kind() == reflect.Slice && v.IsNil() {
			return []any{}
		}
		out := make([]any, 0, min(n, maxListItems))
		for i := 0; i < n && i < maxListItems; i++ {
			out = append(out, tree(v.Index(i), depth+1))
		}
		if n > maxListItems {
			out = append(out, textVal(fmt.Sprintf("… %d more", n-maxListItems)))
		}
		return out
	case reflect.Map:
		keys := v.MapKeys()
		type ent struct {
			k string
			v reflect.Value
		}
		ents := make([]ent, len(keys))
		for i, k := range keys {
			ents[i] = ent{fmt.Sprint(tree(k, depth+1)), v.MapIndex(k)}
		}
		sort.Slice(ents, func(i, j int) bool { return ents[i].k < ents[j].k })
		var o obj
		for _, e := range ents {
			o = append(o, kv{e.k, tree(e.v, depth+1)})
		}
		return o
	case reflect.Bool:
		return v.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return v.Uint()
	case reflect.Float32, reflect.Float64:
		f := v.Float()
		if f != f || f > 1e308 || f < -1e308 { // NaN/Inf: not representable in JSON
			return textVal(strconv.FormatFloat(f, 'g', -1, 64))
		}
		return f
	case reflect.String:
		return v.String()
	}
	return textVal("<" + t.String() + ">")
}

// fields expands the exported fields of struct v.
func fields(v reflect.Value, depth int) obj {
	t := v.Type()
	o := obj{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		o = append(o, kv{f.Name, tree(v.Field(i), depth+1)})
	}
	return o
}

// structVal is a struct with its own short, non-redacting String form:
// text shows that form, JSON every exported field.
type structVal struct {
	Text   string
	Fields obj
}

func (s structVal) MarshalJSON() ([]byte, error) { return s.Fields.MarshalJSON() }

// stringerOf calls String on v when its type (or pointer type) has one. A
// panicking String method yields a placeholder, never a crash.
func stringerOf(v reflect.Value) (s string, ok bool) {
	var st fmt.Stringer
	switch {
	case v.Type().Implements(stringerType) && v.CanInterface():
		st = v.Interface().(fmt.Stringer)
	case reflect.PointerTo(v.Type()).Implements(stringerType) && v.CanAddr() && v.Addr().CanInterface():
		st = v.Addr().Interface().(fmt.Stringer)
	default:
		return "", false
	}
	defer func() {
		if recover() != nil {
			s = "<String panicked>"
		}
	}()
	return st.String(), true
}

// isNewtype reports a struct whose only field is embedded: wire.RunnerId
// {ulid.ULID}, wire.CapabilityDigest{Digest}.
func isNewtype(t reflect.Type) bool {
	return t.NumField() == 1 && t.Field(0).Anonymous
}

// redacting reports a type that controls its printing with GoString or
// Format (as redacting types such as SecretMaterialV1 do): never expanded,
// not even in JSON.
func redacting(t reflect.Type) bool {
	for _, it := range []reflect.Type{goStringerType, formatterType} {
		if t.Implements(it) || reflect.PointerTo(t).Implements(it) {
			return true
		}
	}
	return false
}

// selfPrinting reports a type that controls all of its printing (String
// plus GoString, Format or LogValue), as redacting types do.
func selfPrinting(t reflect.Type) bool {
	for _, it := range []reflect.Type{goStringerType, formatterType, logValuerType} {
		if t.Implements(it) || reflect.PointerTo(t).Implements(it) {
			return true
		}
	}
	return false
}

// writeText prints a tree as indented "key: value" lines.
func writeText(w io.Writer, indent string, key string, v any) {
	prefix := indent
	if key != "" {
		prefix += key + ":"
	}
	switch x := v.(type) {
	case obj:
		if len(x) == 0 {
			fmt.Fprintln(w, prefix+" {}")
			return
		}
		if key != "" {
			fmt.Fprintln(w, prefix)
			indent += "  "
		}
		for _, f := range x {
			writeText(w, indent, f.K, f.V)
		}
	case []any:
		if len(x) == 0 {
			fmt.Fprintln(w, prefix+" []")
			return
		}
		fmt.Fprintf(w, "%s [%d]\n", prefix, len(x))
		for i, e := range x {
			writeText(w, indent+"  ", "["+strconv.Itoa(i)+"]", e)
		}
	default:
		fmt.Fprintln(w, prefix+" "+scalarText(v))
	}
}

func scalarText(v any) string {
	switch x := v.(type) {
	case nil:
		return "none"
	case enumVal:
		return x.Name + " (" + x.N + ")"
	case bytesVal:
		return bytesText(x)
	case textVal:
		return string(x)
	case structVal:
		return x.Text
	case string:
		return strconv.Quote(x)
	}
	return fmt.Sprint(v)
}

func bytesText(b []byte) string {
	s := fmt.Sprintf("[%d bytes]", len(b))
	if len(b) == 0 {
		return s
	}
	h := b
	if len(h) > textHexLimit {
		h = h[:textHexLimit]
	}
	s += " " + hex.EncodeToString(h)
	if len(b) > textHexLimit {
		s += "…"
	}
	if printable(b) {
		t := string(b)
		if len(t) > 2*textHexLimit {
			t = t[:2*textHexLimit]
			for !utf8.ValidString(t) {
				t = t[:len(t)-1]
			}
			s += " " + strconv.Quote(t) + "…"
		} else {
			s += " " + strconv.Quote(t)
		}
	}
	return s
}

func printable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if !unicode.IsPrint(r) && r != '\n' && r != '\t' && r != '\r' {
			return false
		}
	}
	return true
}
