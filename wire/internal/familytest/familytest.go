// Package familytest is the one family-generic test suite that every V1
// message family package runs (wire/logs, cas, health, admin, signing,
// device): registration, sample round trips through the body and the
// registry, determinism, zero-allocation encoding, truncation, bad encodings,
// validation and MaxSize. It is imported by tests only.
package familytest

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

// Family describes one family package for Run.
type Family struct {
	Family       wire.Family
	Prefix       string // registry name prefix, e.g. "logs."
	Messages     []wire.MessageInfo
	Samples      func() []wire.Message
	BadEncodings []BadEncoding
	Invalid      []Invalid
	Maximal      []wire.Message // one maximal instance per type (every bound reached)
}

// Run runs the suite as subtests of t.
func Run(t *testing.T, f Family) {
	t.Run("Registered", f.messagesRegistered)
	t.Run("SamplesRoundTrip", f.samplesRoundTrip)
	t.Run("SamplesDeterministic", f.samplesDeterministic)
	t.Run("AppendZeroAlloc", f.appendPostcardZeroAlloc)
	t.Run("TruncatedFail", f.truncatedSamplesFail)
	t.Run("BadEncodingsRejected", f.badEncodingsRejected)
	t.Run("ValidateRejects", f.validateRejects)
	t.Run("MaxSizeHoldsForMaximal", f.maxSizeHoldsForMaximal)
}

// SampleName names the i-th sample m in test output.
func SampleName(m wire.Message, i int) string {
	return fmt.Sprintf("%s#%d", reflect.TypeOf(m).Elem().Name(), i)
}

// InfoOf returns the registry entry of typ in messages, failing t if absent.
func InfoOf(t *testing.T, messages []wire.MessageInfo, typ wire.MessageTypeId) *wire.MessageInfo {
	return infoOf(t, messages, typ)
}

func infoOf(t *testing.T, messages []wire.MessageInfo, typ wire.MessageTypeId) *wire.MessageInfo {
	t.Helper()
	for i := range messages {
		if messages[i].Type == typ {
			return &messages[i]
		}
	}
	t.Fatalf("type %s is not in Messages", typ)
	return nil
}

// DecodeBody decodes body into a fresh value of m's type, recovering a panic
// into a test failure.
func DecodeBody(t *testing.T, messages []wire.MessageInfo, typ wire.MessageTypeId, body []byte) (got wire.Message, err error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("decoding %x panicked: %v", body, r)
		}
	}()
	got = infoOf(t, messages, typ).New()
	d := postcard.NewDecoder(body)
	got.DecodePostcard(&d)
	return got, d.Finish()
}

func (f Family) messagesRegistered(t *testing.T) {
	r, err := wire.NewRegistry(f.Messages)
	if err != nil {
		t.Fatal(err)
	}
	sampled := map[wire.MessageTypeId]bool{}
	for _, m := range f.Samples() {
		if _, ok := r.Lookup(m.MessageType()); !ok {
			t.Errorf("sample %T has unregistered type %s", m, m.MessageType())
		}
		sampled[m.MessageType()] = true
	}
	for _, mi := range f.Messages {
		if mi.Type.Family() != f.Family {
			t.Errorf("%s: family %s, want %s", mi.Name, mi.Type.Family(), f.Family)
		}
		want := f.Prefix + reflect.TypeOf(mi.New()).Elem().Name()
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

func (f Family) samplesRoundTrip(t *testing.T) {
	r := wire.MustRegistry(f.Messages)
	for i, m := range f.Samples() {
		t.Run(SampleName(m, i), func(t *testing.T) {
			if err := m.Validate(); err != nil {
				t.Fatalf("sample does not validate: %v", err)
			}
			body := m.AppendPostcard(nil)
			if mi := infoOf(t, f.Messages, m.MessageType()); len(body) > mi.MaxSize {
				t.Fatalf("body %d bytes > MaxSize %d", len(body), mi.MaxSize)
			}
			got, err := DecodeBody(t, f.Messages, m.MessageType(), body)
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
			if _, err := DecodeBody(t, f.Messages, m.MessageType(), append(body, 0)); !errors.Is(err, postcard.ErrTrailingBytes) {
				t.Fatalf("trailing byte: got %v, want ErrTrailingBytes", err)
			}
		})
	}
}

func (f Family) samplesDeterministic(t *testing.T) {
	a, b := f.Samples(), f.Samples()
	for i := range a {
		if !bytes.Equal(a[i].AppendPostcard(nil), b[i].AppendPostcard(nil)) {
			t.Errorf("%s: samples differ between calls", SampleName(a[i], i))
		}
	}
}

func (f Family) appendPostcardZeroAlloc(t *testing.T) {
	for i, m := range append(f.Samples(), f.Maximal...) {
		buf := make([]byte, 0, len(m.AppendPostcard(nil)))
		if n := testing.AllocsPerRun(50, func() { buf = m.AppendPostcard(buf[:0]) }); n != 0 {
			t.Errorf("%s: AppendPostcard allocates %.1f times", SampleName(m, i), n)
		}
	}
}

// Every proper prefix of every sample's encoding fails with a typed postcard
// error, and never panics.
func (f Family) truncatedSamplesFail(t *testing.T) {
	for i, m := range f.Samples() {
		body := m.AppendPostcard(nil)
		for n := 0; n < len(body); n++ {
			_, err := DecodeBody(t, f.Messages, m.MessageType(), body[:n:n])
			var pe *postcard.Error
			if !errors.As(err, &pe) {
				t.Fatalf("%s truncated to %d/%d bytes: got %v, want a *postcard.Error", SampleName(m, i), n, len(body), err)
			}
		}
	}
}

// badEncodings encode values that break a wire rule (a bound, an enum range):
// decoding fails with the given error, and Validate rejects the value too.
func (f Family) badEncodingsRejected(t *testing.T) {
	for _, tc := range f.BadEncodings {
		t.Run(tc.Name, func(t *testing.T) {
			_, err := DecodeBody(t, f.Messages, tc.M.MessageType(), tc.M.AppendPostcard(nil))
			if !errors.Is(err, tc.Want) {
				t.Fatalf("decode: got %v, want %v", err, tc.Want)
			}
			if err := tc.M.Validate(); err == nil {
				t.Fatalf("Validate accepted a value that does not decode")
			}
		})
	}
}

func (f Family) validateRejects(t *testing.T) {
	for _, tc := range f.Invalid {
		t.Run(tc.Name, func(t *testing.T) {
			err := tc.M.Validate()
			if !errors.Is(err, postcard.ErrInvalidValue) {
				t.Fatalf("Validate: got %v, want an ErrInvalidValue", err)
			}
			if !strings.HasPrefix(err.Error(), strings.TrimSuffix(f.Prefix, ".")+": ") {
				t.Fatalf("error %q does not name the family", err)
			}
		})
	}
}

// MaxSize bounds the encoding of a maximal instance: every string, bytes and
// sequence at its bound and every number at its largest valid value.
func (f Family) maxSizeHoldsForMaximal(t *testing.T) {
	covered := map[wire.MessageTypeId]bool{}
	for i, m := range f.Maximal {
		covered[m.MessageType()] = true
		if err := m.Validate(); err != nil {
			t.Fatalf("%s: maximal instance does not validate: %v", SampleName(m, i), err)
		}
		body := m.AppendPostcard(nil)
		mi := infoOf(t, f.Messages, m.MessageType())
		if len(body) > mi.MaxSize {
			t.Errorf("%s: %d bytes > MaxSize %d", mi.Name, len(body), mi.MaxSize)
		}
		if got, err := DecodeBody(t, f.Messages, m.MessageType(), body); err != nil || !reflect.DeepEqual(got, m) {
			t.Errorf("%s: maximal instance does not round-trip: %v", mi.Name, err)
		}
		t.Logf("%s: maximal %d bytes, MaxSize %d", mi.Name, len(body), mi.MaxSize)
	}
	for _, mi := range f.Messages {
		if !covered[mi.Type] {
			t.Errorf("%s has no maximal instance", mi.Name)
		}
	}
}

// BadEncoding is a value that breaks a wire rule (a bound, an enum range):
// decoding its encoding fails with Want, and Validate rejects it too.
type BadEncoding struct {
	Name string
	M    wire.Message
	Want error
}

// Invalid is a value that Validate must reject with postcard.ErrInvalidValue
// and an error text naming the family.
type Invalid struct {
	Name string
	M    wire.Message
}
