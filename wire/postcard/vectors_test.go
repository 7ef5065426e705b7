package postcard_test

// Conformance harness: a schema-driven interpreter that runs every golden
// vector produced by the Rust postcard crate (format and rules in
// shared/postcard-vectors/README.md) through this package's Append* API and
// Decoder.
//
// Extra vector files can be run the same way:
//
//	POSTCARD_VECTORS=/path/a.json:/path/b.json go test ./wire/postcard/ -run Vectors
//
// Deliberate strictness: Rust's postcard::from_bytes ignores trailing bytes;
// our Decoder.Finish rejects them with CodeTrailingBytes because every value
// we decode fills its frame exactly. The accept_noncanonical vectors with
// trailing > 0 are therefore checked as "the value decodes and leaves exactly
// `trailing` bytes", and Finish is asserted to fail on them.

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	"forgeyard.dev/transport/wire/postcard"
)

const sharedVectors = "../../../shared/postcard-vectors/vectors.json"

// projectVectors are this repository's own vectors in the same format, for
// shapes the shared file lacks (testdata/README.md says how each was derived).
const projectVectors = "testdata/vectors.json"

type vector struct {
	Name         string          `json:"name"`
	Kind         string          `json:"kind"`
	Schema       json.RawMessage `json:"schema"`
	Value        json.RawMessage `json:"value"`
	Hex          string          `json:"hex"`
	Error        string          `json:"error"`
	CanonicalHex string          `json:"canonical_hex"`
	Trailing     int             `json:"trailing"`
}

// loadVectors parses a vectors file. Numbers are kept as json.Number so
// that 64- and 128-bit values and small integers compare exactly.
func loadVectors(t *testing.T, path string) []vector {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("postcard vectors: cannot read %s: %v (the shared/ tree must sit beside the repository checkout, as <parent>/shared next to <parent>/<repo>)", path, err)
	}
	var vs []vector
	if err := json.Unmarshal(raw, &vs); err != nil {
		t.Fatalf("postcard vectors: %s is not a JSON array of vectors: %v", path, err)
	}
	if len(vs) == 0 {
		t.Fatalf("postcard vectors: %s holds no vectors", path)
	}
	return vs
}

func TestVectors(t *testing.T) {
	files := []string{sharedVectors, projectVectors}
	if extra := os.Getenv("POSTCARD_VECTORS"); extra != "" {
		for _, p := range filepath.SplitList(extra) {
			if p != "" {
				files = append(files, p)
			}
		}
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runVectorFile(t, f) })
	}
}

func runVectorFile(t *testing.T, path string) {
	vs := loadVectors(t, path)
	pass := map[string]int{}
	total := map[string]int{}
	seen := map[string]bool{}
	for i := range vs {
		v := &vs[i]
		if seen[v.Name] {
			t.Errorf("duplicate vector name %q", v.Name)
		}
		seen[v.Name] = true
		total[v.Kind]++
		ok := t.Run(v.Name, func(t *testing.T) { runVector(t, v) })
		if ok {
			pass[v.Kind]++
		}
	}
	for _, k := range []string{"roundtrip", "reject", "accept_noncanonical"} {
		t.Logf("%s: %s %d/%d passed", filepath.Base(path), k, pass[k], total[k])
	}
	for k := range total {
		switch k {
		case "roundtrip", "reject", "accept_noncanonical":
		default:
			t.Errorf("unknown vector kind %q (%d vectors)", k, total[k])
		}
	}
}

func runVector(t *testing.T, v *vector) {
	s, err := parseSchema(v.Schema)
	if err != nil {
		t.Fatalf("schema: %v", err)
	}
	in, err := hex.DecodeString(v.Hex)
	if err != nil {
		t.Fatalf("hex: %v", err)
	}
	switch v.Kind {
	case "roundtrip":
		want := parseValue(t, v.Value)
		enc, err := encodeValue(nil, s, want)
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		if !bytes.Equal(enc, in) {
			t.Fatalf("encode:\n got %x\nwant %x", enc, in)
		}
		d := postcard.NewDecoder(in)
		got := decodeValue(&d, s)
		if err := d.Finish(); err != nil {
			t.Fatalf("decode %x: %v", in, err)
		}
		assertSameValue(t, got, want)
		// Every strict prefix of a valid encoding must be reported as
		// truncated, never accepted and never as another error.
		for n := 0; n < len(in); n++ {
			d := postcard.NewDecoder(in[:n])
			decodeValue(&d, s)
			if !errors.Is(d.Err(), postcard.ErrUnexpectedEnd) {
				t.Fatalf("prefix %x of %x: err = %v, want unexpected end", in[:n], in, d.Err())
			}
		}
	case "reject":
		d := postcard.NewDecoder(in)
		got := decodeValue(&d, s)
		err := d.Err()
		if err == nil {
			t.Fatalf("decode %x succeeded with %s (remaining %d), want %s", in, jsonString(got), d.Remaining(), v.Error)
		}
		var pe *postcard.Error
		if !errors.As(err, &pe) {
			t.Fatalf("error %v (%T) is not a *postcard.Error", err, err)
		}
		if name := rustName(pe); name != v.Error {
			t.Fatalf("decode %x: %v maps to %q, want %q", in, err, name, v.Error)
		}
		if got != nil {
			t.Fatalf("failed decode returned a value: %s", jsonString(got))
		}
	case "accept_noncanonical":
		want := parseValue(t, v.Value)
		d := postcard.NewDecoder(in)
		got := decodeValue(&d, s)
		if err := d.Err(); err != nil {
			t.Fatalf("decode %x: %v", in, err)
		}
		assertSameValue(t, got, want)
		if d.Remaining() != v.Trailing {
			t.Fatalf("decode %x left %d bytes, want %d trailing", in, d.Remaining(), v.Trailing)
		}
		// Deliberate strictness: Finish rejects what from_bytes ignores.
		err := d.Finish()
		if v.Trailing > 0 && !errors.Is(err, postcard.ErrTrailingBytes) {
			t.Fatalf("Finish with %d trailing bytes: %v, want trailing-bytes error", v.Trailing, err)
		}
		if v.Trailing == 0 && err != nil {
			t.Fatalf("Finish: %v", err)
		}
		canon, err := hex.DecodeString(v.CanonicalHex)
		if err != nil {
			t.Fatalf("canonical_hex: %v", err)
		}
		enc, err := encodeValue(nil, s, want)
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		if !bytes.Equal(enc, canon) {
			t.Fatalf("canonical encode:\n got %x\nwant %x", enc, canon)
		}
	default:
		t.Fatalf("unknown vector kind %q", v.Kind)
	}
}

// rustName maps our error onto the postcard crate's variant name. A length
// above the harness's bound of math.MaxInt cannot be backed by any input on
// a 64-bit machine, so Rust would report it as the input running out.
func rustName(pe *postcard.Error) string {
	if pe.Code == postcard.CodeLengthOverBound && pe.Detail == "" {
		return "DeserializeUnexpectedEnd"
	}
	return pe.Code.RustName()
}

func parseValue(t *testing.T, raw json.RawMessage) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if len(raw) == 0 {
		t.Fatalf("vector has no value")
	}
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("value: %v", err)
	}
	return v
}

func jsonString(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%#v", v)
	}
	return string(b)
}

func assertSameValue(t *testing.T, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded value:\n got %s\nwant %s", jsonString(got), jsonString(want))
	}
}

// ---- schema ----

type field struct {
	name string
	s    *schema
}

type variant struct {
	name string
	kind string // "unit", "newtype", "tuple", "struct"
	s    *schema
	// tuple elements or struct fields
	items  []*schema
	fields []field
}

type schema struct {
	kind     string // primitive name or composite key
	elem     *schema
	key, val *schema
	n        int
	items    []*schema
	fields   []field
	variants []variant
}

var primitives = map[string]bool{
	"bool": true, "u8": true, "i8": true, "u16": true, "u32": true, "u64": true, "u128": true,
	"i16": true, "i32": true, "i64": true, "i128": true, "f32": true, "f64": true,
	"char": true, "string": true, "bytes": true, "unit": true,
}

func parseSchema(raw json.RawMessage) (*schema, error) {
	var name string
	if err := json.Unmarshal(raw, &name); err == nil {
		if !primitives[name] {
			return nil, fmt.Errorf("unknown primitive %q", name)
		}
		return &schema{kind: name}, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || len(obj) != 1 {
		return nil, fmt.Errorf("schema %s is neither a primitive nor a one-key object", raw)
	}
	for k, body := range obj {
		s := &schema{kind: k}
		var err error
		switch k {
		case "option", "seq", "newtype":
			s.elem, err = parseSchema(body)
		case "unit_struct":
			var n string
			err = json.Unmarshal(body, &n)
		case "array":
			var pair []json.RawMessage
			if err = json.Unmarshal(body, &pair); err == nil && len(pair) != 2 {
				err = fmt.Errorf("array needs [S, N]")
			}
			if err == nil {
				if s.elem, err = parseSchema(pair[0]); err == nil {
					err = json.Unmarshal(pair[1], &s.n)
				}
			}
		case "map":
			var pair []json.RawMessage
			if err = json.Unmarshal(body, &pair); err == nil && len(pair) != 2 {
				err = fmt.Errorf("map needs [K, V]")
			}
			if err == nil {
				if s.key, err = parseSchema(pair[0]); err == nil {
					s.val, err = parseSchema(pair[1])
				}
			}
		case "tuple":
			s.items, err = parseSchemaList(body)
		case "struct":
			s.fields, err = parseFields(body)
		case "enum":
			var vs [][]json.RawMessage
			if err = json.Unmarshal(body, &vs); err != nil {
				break
			}
			for _, pv := range vs {
				if len(pv) != 2 {
					return nil, fmt.Errorf("enum variant needs [name, kind]")
				}
				var v variant
				if err = json.Unmarshal(pv[0], &v.name); err != nil {
					return nil, err
				}
				if err = parseVariantKind(pv[1], &v); err != nil {
					return nil, err
				}
				s.variants = append(s.variants, v)
			}
		default:
			err = fmt.Errorf("unknown composite %q", k)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		return s, nil
	}
	panic("unreachable")
}

func parseSchemaList(raw json.RawMessage) ([]*schema, error) {
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, err
	}
	out := make([]*schema, 0, len(list))
	for _, r := range list {
		s, err := parseSchema(r)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

func parseFields(raw json.RawMessage) ([]field, error) {
	var list [][]json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, err
	}
	out := make([]field, 0, len(list))
	for _, p := range list {
		if len(p) != 2 {
			return nil, fmt.Errorf("field needs [name, S]")
		}
		var f field
		if err := json.Unmarshal(p[0], &f.name); err != nil {
			return nil, err
		}
		s, err := parseSchema(p[1])
		if err != nil {
			return nil, err
		}
		f.s = s
		out = append(out, f)
	}
	return out, nil
}

func parseVariantKind(raw json.RawMessage, v *variant) error {
	var unit string
	if err := json.Unmarshal(raw, &unit); err == nil {
		if unit != "unit" {
			return fmt.Errorf("variant kind %q", unit)
		}
		v.kind = "unit"
		return nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || len(obj) != 1 {
		return fmt.Errorf("variant kind %s", raw)
	}
	for k, body := range obj {
		v.kind = k
		var err error
		switch k {
		case "newtype":
			v.s, err = parseSchema(body)
		case "tuple":
			v.items, err = parseSchemaList(body)
		case "struct":
			v.fields, err = parseFields(body)
		default:
			err = fmt.Errorf("variant kind %q", k)
		}
		return err
	}
	return nil
}

// nullable reports whether None and Some(x) would both print as null, so
// Some(x) is written {"some": x}.
func (s *schema) nullable() bool {
	switch s.kind {
	case "unit", "unit_struct", "option":
		return true
	case "newtype":
		return s.elem.nullable()
	}
	return false
}

// minSize is the fewest bytes an encoding of s can take; the harness uses
// it as SeqCap's minimum element size.
func (s *schema) minSize() int {
	switch s.kind {
	case "unit", "unit_struct":
		return 0
	case "f32":
		return 4
	case "f64":
		return 8
	case "char":
		return 2
	case "newtype":
		return s.elem.minSize()
	case "array":
		return s.n * s.elem.minSize()
	case "tuple":
		n := 0
		for _, e := range s.items {
			n += e.minSize()
		}
		return n
	case "struct":
		n := 0
		for _, f := range s.fields {
			n += f.s.minSize()
		}
		return n
	}
	return 1 // every other primitive, option tag, lengths, discriminants
}

// ---- encode ----

func numString(v any) (string, error) {
	switch x := v.(type) {
	case json.Number:
		return string(x), nil
	case string:
		return x, nil
	}
	return "", fmt.Errorf("want a number, got %T", v)
}

func parseUint(v any, bits int) (uint64, error) {
	s, err := numString(v)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(s, 10, bits)
}

func parseInt(v any, bits int) (int64, error) {
	s, err := numString(v)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(s, 10, bits)
}

var two128 = new(big.Int).Lsh(big.NewInt(1), 128)

func parse128(v any, signed bool) (postcard.U128, error) {
	s, err := numString(v)
	if err != nil {
		return postcard.U128{}, err
	}
	b, ok := new(big.Int).SetString(s, 10)
	if !ok {
		return postcard.U128{}, fmt.Errorf("bad 128-bit integer %q", s)
	}
	if b.Sign() < 0 {
		if !signed {
			return postcard.U128{}, fmt.Errorf("negative u128 %q", s)
		}
		b.Add(b, two128)
	}
	if b.Sign() < 0 || b.BitLen() > 128 {
		return postcard.U128{}, fmt.Errorf("128-bit overflow %q", s)
	}
	lo := new(big.Int).And(b, new(big.Int).SetUint64(math.MaxUint64))
	hi := new(big.Int).Rsh(b, 64)
	return postcard.U128{Hi: hi.Uint64(), Lo: lo.Uint64()}, nil
}

func format128(u postcard.U128, signed bool) string {
	b := new(big.Int).SetUint64(u.Hi)
	b.Lsh(b, 64)
	b.Or(b, new(big.Int).SetUint64(u.Lo))
	if signed && u.Hi>>63 == 1 {
		b.Sub(b, two128)
	}
	return b.String()
}

func parseBits(v any, digits int) (uint64, error) {
	m, ok := v.(map[string]any)
	if !ok || len(m) != 1 {
		return 0, fmt.Errorf("float value must be {\"bits\": ...}, got %v", v)
	}
	s, ok := m["bits"].(string)
	if !ok || len(s) != digits {
		return 0, fmt.Errorf("float bits must be %d hex digits", digits)
	}
	return strconv.ParseUint(s, 16, 64)
}

func encodeValue(b []byte, s *schema, v any) ([]byte, error) {
	switch s.kind {
	case "bool":
		x, ok := v.(bool)
		if !ok {
			return nil, fmt.Errorf("bool: got %T", v)
		}
		return postcard.AppendBool(b, x), nil
	case "u8":
		x, err := parseUint(v, 8)
		return postcard.AppendU8(b, uint8(x)), err
	case "u16":
		x, err := parseUint(v, 16)
		return postcard.AppendU16(b, uint16(x)), err
	case "u32":
		x, err := parseUint(v, 32)
		return postcard.AppendU32(b, uint32(x)), err
	case "u64":
		x, err := parseUint(v, 64)
		return postcard.AppendU64(b, x), err
	case "i8":
		x, err := parseInt(v, 8)
		return postcard.AppendI8(b, int8(x)), err
	case "i16":
		x, err := parseInt(v, 16)
		return postcard.AppendI16(b, int16(x)), err
	case "i32":
		x, err := parseInt(v, 32)
		return postcard.AppendI32(b, int32(x)), err
	case "i64":
		x, err := parseInt(v, 64)
		return postcard.AppendI64(b, x), err
	case "u128":
		x, err := parse128(v, false)
		return postcard.AppendU128(b, x), err
	case "i128":
		x, err := parse128(v, true)
		return postcard.AppendI128(b, x), err
	case "f32":
		x, err := parseBits(v, 8)
		return postcard.AppendF32(b, math.Float32frombits(uint32(x))), err
	case "f64":
		x, err := parseBits(v, 16)
		return postcard.AppendF64(b, math.Float64frombits(x)), err
	case "char":
		x, ok := v.(string)
		r := []rune(x)
		if !ok || len(r) != 1 {
			return nil, fmt.Errorf("char: want one scalar, got %v", v)
		}
		return postcard.AppendChar(b, r[0]), nil
	case "string":
		x, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("string: got %T", v)
		}
		return postcard.AppendString(b, x), nil
	case "bytes":
		x, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("bytes: got %T", v)
		}
		p, err := hex.DecodeString(x)
		return postcard.AppendBytes(b, p), err
	case "unit", "unit_struct":
		if v != nil {
			return nil, fmt.Errorf("%s: want null", s.kind)
		}
		return b, nil
	case "option":
		if v == nil {
			return postcard.AppendOption(b, false), nil
		}
		b = postcard.AppendOption(b, true)
		if s.elem.nullable() {
			m, ok := v.(map[string]any)
			inner, has := m["some"]
			if !ok || !has || len(m) != 1 {
				return nil, fmt.Errorf("option of nullable: want {\"some\": x}, got %v", v)
			}
			v = inner
		}
		return encodeValue(b, s.elem, v)
	case "newtype":
		return encodeValue(b, s.elem, v)
	case "seq", "array":
		list, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("%s: got %T", s.kind, v)
		}
		if s.kind == "seq" {
			b = postcard.AppendLen(b, len(list))
		} else if len(list) != s.n {
			return nil, fmt.Errorf("array: %d elements, want %d", len(list), s.n)
		}
		for _, e := range list {
			var err error
			if b, err = encodeValue(b, s.elem, e); err != nil {
				return nil, err
			}
		}
		return b, nil
	case "tuple":
		return encodeTuple(b, s.items, v)
	case "map":
		list, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("map: got %T", v)
		}
		b = postcard.AppendLen(b, len(list))
		for _, e := range list {
			kv, ok := e.([]any)
			if !ok || len(kv) != 2 {
				return nil, fmt.Errorf("map entry must be [k, v]")
			}
			var err error
			if b, err = encodeValue(b, s.key, kv[0]); err != nil {
				return nil, err
			}
			if b, err = encodeValue(b, s.val, kv[1]); err != nil {
				return nil, err
			}
		}
		return b, nil
	case "struct":
		return encodeStruct(b, s.fields, v)
	case "enum":
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("enum: got %T", v)
		}
		name, _ := m["variant"].(string)
		for i := range s.variants {
			vr := &s.variants[i]
			if vr.name != name {
				continue
			}
			b = postcard.AppendVariant(b, uint32(i))
			payload, has := m["value"]
			switch vr.kind {
			case "unit":
				if has {
					return nil, fmt.Errorf("unit variant %s with a value", name)
				}
				return b, nil
			case "newtype":
				return encodeValue(b, vr.s, payload)
			case "tuple":
				return encodeTuple(b, vr.items, payload)
			case "struct":
				return encodeStruct(b, vr.fields, payload)
			}
		}
		return nil, fmt.Errorf("enum: no variant %q", name)
	}
	return nil, fmt.Errorf("unknown schema kind %q", s.kind)
}

func encodeTuple(b []byte, items []*schema, v any) ([]byte, error) {
	list, ok := v.([]any)
	if !ok || len(list) != len(items) {
		return nil, fmt.Errorf("tuple: want %d elements, got %v", len(items), v)
	}
	for i, e := range list {
		var err error
		if b, err = encodeValue(b, items[i], e); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func encodeStruct(b []byte, fields []field, v any) ([]byte, error) {
	m, ok := v.(map[string]any)
	if !ok || len(m) != len(fields) {
		return nil, fmt.Errorf("struct: want %d fields, got %v", len(fields), v)
	}
	for _, f := range fields {
		fv, has := m[f.name]
		if !has {
			return nil, fmt.Errorf("struct: missing field %q", f.name)
		}
		var err error
		if b, err = encodeValue(b, f.s, fv); err != nil {
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
	}
	return b, nil
}

// ---- decode ----

// maxZeroSized bounds how many zero-sized elements the harness will
// materialise for a Vec<()> so hostile counts cannot make it loop forever.
const maxZeroSized = 1 << 16

// decodeValue decodes s and returns it in the vectors' JSON value model, or
// nil once the decoder has failed.
func decodeValue(d *postcard.Decoder, s *schema) any {
	v := decodeInner(d, s)
	if d.Failed() {
		return nil
	}
	return v
}

func num(u uint64) any { return json.Number(strconv.FormatUint(u, 10)) }
func inum(i int64) any { return json.Number(strconv.FormatInt(i, 10)) }

func decodeInner(d *postcard.Decoder, s *schema) any {
	if d.Failed() {
		return nil
	}
	switch s.kind {
	case "bool":
		return d.Bool()
	case "u8":
		return num(uint64(d.U8()))
	case "u16":
		return num(uint64(d.U16()))
	case "u32":
		return num(uint64(d.U32()))
	case "u64":
		return strconv.FormatUint(d.U64(), 10)
	case "i8":
		return inum(int64(d.I8()))
	case "i16":
		return inum(int64(d.I16()))
	case "i32":
		return inum(int64(d.I32()))
	case "i64":
		return strconv.FormatInt(d.I64(), 10)
	case "u128":
		return format128(d.U128(), false)
	case "i128":
		return format128(d.I128(), true)
	case "f32":
		return map[string]any{"bits": fmt.Sprintf("%08x", math.Float32bits(d.F32()))}
	case "f64":
		return map[string]any{"bits": fmt.Sprintf("%016x", math.Float64bits(d.F64()))}
	case "char":
		return string(d.Char())
	case "string":
		return d.String(math.MaxInt)
	case "bytes":
		return hex.EncodeToString(d.BytesRef(math.MaxInt))
	case "unit", "unit_struct":
		return nil
	case "option":
		if !d.Option() {
			return nil
		}
		inner := decodeInner(d, s.elem)
		if s.elem.nullable() {
			return map[string]any{"some": inner}
		}
		return inner
	case "newtype":
		return decodeInner(d, s.elem)
	case "seq":
		// Element by element, as Rust's postcard does: a count beyond the
		// input fails at the first element that fails, with its own error.
		min := s.elem.minSize()
		n := seqCount(d)
		if min == 0 && n > maxZeroSized {
			d.Fail(postcard.CodeLengthOverBound, "harness: too many zero-sized elements")
		}
		list := make([]any, 0, d.SeqCap(n, min))
		for i := 0; i < n && !d.Failed(); i++ {
			list = append(list, decodeInner(d, s.elem))
		}
		return list
	case "array":
		list := []any{}
		for i := 0; i < s.n && !d.Failed(); i++ {
			list = append(list, decodeInner(d, s.elem))
		}
		return list
	case "tuple":
		return decodeTuple(d, s.items)
	case "map":
		min := s.key.minSize() + s.val.minSize()
		n := seqCount(d)
		if min == 0 && n > maxZeroSized {
			d.Fail(postcard.CodeLengthOverBound, "harness: too many zero-sized entries")
		}
		list := make([]any, 0, d.SeqCap(n, min))
		for i := 0; i < n && !d.Failed(); i++ {
			k := decodeInner(d, s.key)
			v := decodeInner(d, s.val)
			list = append(list, []any{k, v})
		}
		return list
	case "struct":
		return decodeStruct(d, s.fields)
	case "enum":
		i := d.Variant(uint32(len(s.variants)))
		if d.Failed() {
			return nil
		}
		vr := &s.variants[i]
		out := map[string]any{"variant": vr.name}
		switch vr.kind {
		case "newtype":
			out["value"] = decodeInner(d, vr.s)
		case "tuple":
			out["value"] = decodeTuple(d, vr.items)
		case "struct":
			out["value"] = decodeStruct(d, vr.fields)
		}
		return out
	}
	d.Fail(postcard.CodeInvalidValue, "harness: unknown schema kind")
	return nil
}

// seqCount reads a seq or map count as Rust does on a 64-bit target: any
// usize, with no bound. A count above math.MaxInt cannot be backed by any
// input, but Rust still decodes the elements that are there first, so an
// invalid one reports its own error; it is clamped to math.MaxInt and the
// element loop ends when the input does (every element but a zero-sized one
// takes at least one byte, and those are bounded by maxZeroSized).
func seqCount(d *postcard.Decoder) int {
	c := d.U64() // usize: the same varint as u64
	if c > math.MaxInt {
		return math.MaxInt
	}
	return int(c)
}

func decodeTuple(d *postcard.Decoder, items []*schema) any {
	list := []any{}
	for _, e := range items {
		list = append(list, decodeInner(d, e))
	}
	return list
}

func decodeStruct(d *postcard.Decoder, fields []field) any {
	m := map[string]any{}
	for _, f := range fields {
		m[f.name] = decodeInner(d, f.s)
	}
	return m
}
