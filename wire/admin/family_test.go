package admin

// Family-generic tests. wire/logs, cas, health, admin, signing and device
// carry the same copy of this file; each package's own test file defines
// testFamily, testPrefix, badEncodings, invalidMessages and maximalMessages.

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

func infoOf(t *testing.T, typ wire.MessageTypeId) *wire.MessageInfo {
	t.Helper()
	for i := range Messages {
		if Messages[i].Type == typ {
			return &Messages[i]
		}
	}
	t.Fatalf("type %s is not in Messages", typ)
	return nil
}

func sampleName(m wire.Message, i int) string {
	return fmt.Sprintf("%s#%d", reflect.TypeOf(m).Elem().Name(), i)
}

// decodeBody decodes body into a fresh value of m's type, recovering a panic
// into a test failure.
func decodeBody(t *testing.T, typ wire.MessageTypeId, body []byte) (got wire.Message, err error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("decoding %x panicked: %v", body, r)
		}
	}()
	got = infoOf(t, typ).New()
	d := postcard.NewDecoder(body)
	got.DecodePostcard(&d)
	return got, d.Finish()
}

func TestMessagesRegistered(t *testing.T) {
	r, err := wire.NewRegistry(Messages)
	if err != nil {
		t.Fatal(err)
	}
	sampled := map[wire.MessageTypeId]bool{}
	for _, m := range Samples() {
		if _, ok := r.Lookup(m.MessageType()); !ok {
			t.Errorf("sample %T has unregistered type %s", m, m.MessageType())
		}
		sampled[m.MessageType()] = true
	}
	for _, mi := range Messages {
		if mi.Type.Family() != testFamily {
			t.Errorf("%s: family %s, want %s", mi.Name, mi.Type.Family(), testFamily)
		}
		want := testPrefix + reflect.TypeOf(mi.New()).Elem().Name()
		if mi.Name != want {
			t.Errorf("%s: name should be %s", mi.Name, want)
		}
		if mi.Since != wire.V(1, 0) || mi.MaxSize < 0 || mi.Sensitive {
			t.Errorf("%s: since %v, max size %d, sensitive %v (none of these families carries secrets)", mi.Name, mi.Since, mi.MaxSize, mi.Sensitive)
		}
		if !sampled[mi.Type] {
			t.Errorf("%s has no sample", mi.Name)
		}
	}
}

func TestSamplesRoundTrip(t *testing.T) {
	r := wire.MustRegistry(Messages)
	for i, m := range Samples() {
		t.Run(sampleName(m, i), func(t *testing.T) {
			if err := m.Validate(); err != nil {
				t.Fatalf("sample does not validate: %v", err)
			}
			body := m.AppendPostcard(nil)
			if mi := infoOf(t, m.MessageType()); len(body) > mi.MaxSize {
				t.Fatalf("body %d bytes > MaxSize %d", len(body), mi.MaxSize)
			}
			got, err := decodeBody(t, m.MessageType(), body)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !reflect.DeepEqual(got, m) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", got, m)
			}
			if again := got.AppendPostcard(nil); !bytes.Equal(again, body) {
				t.Fatalf("re-encode differs:\n got %x\nwant %x", again, body)
			}
			// Append semantics: the body follows whatever b holds.
			if pre := m.AppendPostcard([]byte{0xee}); pre[0] != 0xee || !bytes.Equal(pre[1:], body) {
				t.Fatalf("AppendPostcard does not append")
			}
			// Through the family payload enum and the registry.
			payload := wire.AppendMessage(nil, m)
			d := postcard.NewDecoder(payload)
			viaReg, err := r.DecodeMessage(&d)
			if err != nil || !reflect.DeepEqual(viaReg, m) {
				t.Fatalf("registry decode: %v\n got %+v\nwant %+v", err, viaReg, m)
			}
			// A trailing byte is rejected.
			if _, err := decodeBody(t, m.MessageType(), append(body, 0)); !errors.Is(err, postcard.ErrTrailingBytes) {
				t.Fatalf("trailing byte: got %v, want ErrTrailingBytes", err)
			}
		})
	}
}

func TestSamplesDeterministic(t *testing.T) {
	a, b := Samples(), Samples()
	for i := range a {
		if !bytes.Equal(a[i].AppendPostcard(nil), b[i].AppendPostcard(nil)) {
			t.Errorf("%s: samples differ between calls", sampleName(a[i], i))
		}
	}
}

func TestAppendPostcardZeroAlloc(t *testing.T) {
	for i, m := range append(Samples(), maximalMessages()...) {
		buf := make([]byte, 0, len(m.AppendPostcard(nil)))
		if n := testing.AllocsPerRun(50, func() { buf = m.AppendPostcard(buf[:0]) }); n != 0 {
			t.Errorf("%s: AppendPostcard allocates %.1f times", sampleName(m, i), n)
		}
	}
}

// Every proper prefix of every sample's encoding fails with a typed postcard
// error, and never panics.
func TestTruncatedSamplesFail(t *testing.T) {
	for i, m := range Samples() {
		body := m.AppendPostcard(nil)
		for n := 0; n < len(body); n++ {
			_, err := decodeBody(t, m.MessageType(), body[:n:n])
			var pe *postcard.Error
			if !errors.As(err, &pe) {
				t.Fatalf("%s truncated to %d/%d bytes: got %v, want a *postcard.Error", sampleName(m, i), n, len(body), err)
			}
		}
	}
}

// badEncodings encode values that break a wire rule (a bound, an enum range):
// decoding fails with the given error, and Validate rejects the value too.
func TestBadEncodingsRejected(t *testing.T) {
	for _, tc := range badEncodings() {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeBody(t, tc.m.MessageType(), tc.m.AppendPostcard(nil))
			if !errors.Is(err, tc.want) {
				t.Fatalf("decode: got %v, want %v", err, tc.want)
			}
			if err := tc.m.Validate(); err == nil {
				t.Fatalf("Validate accepted a value that does not decode")
			}
		})
	}
}

func TestValidateRejects(t *testing.T) {
	for _, tc := range invalidMessages() {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.m.Validate()
			if !errors.Is(err, postcard.ErrInvalidValue) {
				t.Fatalf("Validate: got %v, want an ErrInvalidValue", err)
			}
			if !strings.HasPrefix(err.Error(), strings.TrimSuffix(testPrefix, ".")+": ") {
				t.Fatalf("error %q does not name the family", err)
			}
		})
	}
}

// MaxSize bounds the encoding of a maximal instance: every string, bytes and
// sequence at its bound and every number at its largest valid value.
func TestMaxSizeHoldsForMaximal(t *testing.T) {
	covered := map[wire.MessageTypeId]bool{}
	for i, m := range maximalMessages() {
		covered[m.MessageType()] = true
		if err := m.Validate(); err != nil {
			t.Fatalf("%s: maximal instance does not validate: %v", sampleName(m, i), err)
		}
		body := m.AppendPostcard(nil)
		mi := infoOf(t, m.MessageType())
		if len(body) > mi.MaxSize {
			t.Errorf("%s: %d bytes > MaxSize %d", mi.Name, len(body), mi.MaxSize)
		}
		if got, err := decodeBody(t, m.MessageType(), body); err != nil || !reflect.DeepEqual(got, m) {
			t.Errorf("%s: maximal instance does not round-trip: %v", mi.Name, err)
		}
		t.Logf("%s: maximal %d bytes, MaxSize %d", mi.Name, len(body), mi.MaxSize)
	}
	for _, mi := range Messages {
		if !covered[mi.Type] {
			t.Errorf("%s has no maximal instance", mi.Name)
		}
	}
}

type badEncoding struct {
	name string
	m    wire.Message
	want error
}

type invalidMessage struct {
	name string
	m    wire.Message
}
