package admin

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/health"
	"forgeyard.dev/transport/wire/postcard"
)

const (
	testFamily = wire.FamilyAdmin
	testPrefix = "admin."
)

func badEncodings() []badEncoding {
	return []badEncoding{
		{"drain reason", &DrainV1{Reason: strings.Repeat("r", MaxText+1)}, postcard.ErrLengthOverBound},
		{"ack message", &AdminAckV1{Acked: MsgDrain, Message: strings.Repeat("m", MaxText+1)}, postcard.ErrLengthOverBound},
		{"probe kind", &RunHealthProbeV1{Probe: 4}, postcard.ErrBadEnum},
		{"drain reason UTF-8", &DrainV1{Reason: "\xc3"}, postcard.ErrBadUTF8},
	}
}

func invalidMessages() []invalidMessage {
	return []invalidMessage{
		{"drain reason", &DrainV1{Reason: strings.Repeat("r", MaxText+1)}},
		{"probe kind", &RunHealthProbeV1{Probe: 4}},
		{"ack of zero type", &AdminAckV1{Accepted: true}},
		{"ack of an ack", &AdminAckV1{Acked: MsgAdminAck}},
		{"ack of another family", &AdminAckV1{Acked: wire.TypeID(wire.FamilyAgent, 0x01)}},
		{"ack message", &AdminAckV1{Acked: MsgResume, Message: strings.Repeat("m", MaxText+1)}},
		{"ack message UTF-8", &AdminAckV1{Acked: MsgResume, Message: "\xff"}},
	}
}

func maximalMessages() []wire.Message {
	return []wire.Message{
		&DrainV1{Reason: strings.Repeat("r", MaxText), DeadlineMs: math.MaxUint64},
		&ResumeV1{},
		&RefreshCapabilitiesV1{},
		&RunHealthProbeV1{Probe: health.ProbeFull},
		&AdminAckV1{Acked: MsgRunHealthProbe, Accepted: true, Message: strings.Repeat("m", MaxText)},
	}
}

// A bool other than 0/1 is rejected.
func TestAckBadBool(t *testing.T) {
	body := (&AdminAckV1{Acked: MsgDrain, Accepted: true}).AppendPostcard(nil)
	body[len(body)-2] = 2 // the bool precedes the empty message's length byte
	if _, err := decodeBody(t, MsgAdminAck, body); !errors.Is(err, postcard.ErrBadBool) {
		t.Fatalf("got %v, want ErrBadBool", err)
	}
}

var shellLike = []string{"command", "cmd", "args", "argv", "script", "shell", "env", "exec", "program", "binary"}

// shellLikeFields walks every field of typ, nested structs, pointers, slices
// and arrays included, and reports shell-like names, lists of strings (an
// argv in disguise) and maps (an environment in disguise).
func shellLikeFields(path string, typ reflect.Type, depth int) (bad []string) {
	if depth > 8 {
		return []string{path + ": type nesting too deep"}
	}
	switch typ.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array:
		if typ.Kind() == reflect.Slice && typ.Elem().Kind() == reflect.String {
			bad = append(bad, path+": list of strings")
		}
		bad = append(bad, shellLikeFields(path+"[]", typ.Elem(), depth+1)...)
	case reflect.Map:
		bad = append(bad, path+": map")
	case reflect.Struct:
		if typ.PkgPath() == "github.com/oklog/ulid/v2" {
			return nil
		}
		for i := range typ.NumField() {
			f := typ.Field(i)
			for _, word := range shellLike {
				if strings.Contains(strings.ToLower(f.Name), word) {
					bad = append(bad, path+"."+f.Name+": shell-like name")
				}
			}
			bad = append(bad, shellLikeFields(path+"."+f.Name, f.Type, depth+1)...)
		}
	}
	return bad
}

// No remote shell (§98): no admin message may carry anything shell-like.
func TestNoShellLikeFields(t *testing.T) {
	for _, mi := range Messages {
		if bad := shellLikeFields(mi.Name, reflect.TypeOf(mi.New()).Elem(), 0); len(bad) != 0 {
			t.Errorf("%s", strings.Join(bad, "; "))
		}
	}
	// The walker catches what it is meant to catch.
	type sneaky struct {
		Reason string
		Nested []struct {
			ExecPath string
			Vars     map[string]string
			Argv0    []string
		}
	}
	if bad := shellLikeFields("sneaky", reflect.TypeOf(sneaky{}), 0); len(bad) != 4 {
		t.Fatalf("walker found %q, want ExecPath, Vars, Argv0 (name and list)", bad)
	}
}

func TestIsCommand(t *testing.T) {
	for _, mi := range Messages {
		if got, want := IsCommand(mi.Type), mi.Type != MsgAdminAck; got != want {
			t.Errorf("IsCommand(%s) = %v", mi.Name, got)
		}
	}
}
