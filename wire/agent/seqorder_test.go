package agent

import (
	"errors"
	"reflect"
	"testing"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

// heartbeatHead is a HeartbeatV1 body up to and including its
// active_attempts count.
func heartbeatHead(count int) []byte {
	var id [16]byte
	for i := range id {
		id[i] = byte(i + 1)
	}
	b := append(id[:], id[:]...)  // runner, session
	b = postcard.AppendU64(b, 42) // seq
	return postcard.AppendLen(b, count)
}

// activeAttempt encodes one ActiveAttemptV1 with the given raw phase number.
func activeAttempt(phase uint32) []byte {
	var id [16]byte
	id[15] = 9
	b := append(id[:], id[:]...) // attempt, lease
	b = postcard.AppendVariant(b, phase)
	return postcard.AppendU64(b, 7) // log_seq
}

// TestSeqDecodeOrderHeartbeat: a Vec<ActiveAttemptV1> declaring 5 elements
// whose 2nd has an invalid phase, with the input ending after it, fails with
// the bad variant (Rust: SerdeDeCustom), not with unexpected end; with a
// valid 2nd element it fails with unexpected end at the 3rd.
func TestSeqDecodeOrderHeartbeat(t *testing.T) {
	head := heartbeatHead(5)
	bad := append(append(append([]byte(nil), head...), activeAttempt(1)...), activeAttempt(7)...)
	var m HeartbeatV1
	d := postcard.NewDecoder(bad)
	m.DecodePostcard(&d)
	var pe *postcard.Error
	if !errors.As(d.Err(), &pe) || pe.Code != postcard.CodeBadEnum || pe.Code.RustName() != "SerdeDeCustom" {
		t.Fatalf("invalid 2nd element: %v, want a bad enum (SerdeDeCustom)", d.Err())
	}
	if want := len(head) + len(activeAttempt(1)) + 32; pe.Offset != want {
		t.Fatalf("error at offset %d, want %d (the 2nd element's phase)", pe.Offset, want)
	}
	good := append(append(append([]byte(nil), head...), activeAttempt(1)...), activeAttempt(2)...)
	d = postcard.NewDecoder(good)
	m.DecodePostcard(&d)
	if !errors.As(d.Err(), &pe) || pe.Code != postcard.CodeUnexpectedEnd || pe.Offset != len(good) {
		t.Fatalf("2 of 5 elements: %v, want unexpected end at offset %d", d.Err(), len(good))
	}
	// The allocation is bounded by the input: MaxActiveAttempts declared,
	// room for 2.
	d = postcard.NewDecoder(append(heartbeatHead(MaxActiveAttempts), good[len(head):]...))
	m = HeartbeatV1{}
	m.DecodePostcard(&d)
	if !errors.Is(d.Err(), postcard.ErrUnexpectedEnd) || cap(m.ActiveAttempts) > 2 {
		t.Fatalf("err %v, cap %d: want unexpected end and at most 2 allocated", d.Err(), cap(m.ActiveAttempts))
	}
}

// TestSeqDecodeOrderCompletion: the 2nd output of an AttemptCompletionV1
// with an unknown digest algorithm is reported as such when the declared
// count (MaxOutputs) cannot fit in the input.
func TestSeqDecodeOrderCompletion(t *testing.T) {
	m := first[*AttemptCompletionV1](t)
	var b []byte
	for _, id := range [][16]byte{m.Job.ULID, m.Attempt.ULID, m.Lease.ULID} {
		b = append(b, id[:]...)
	}
	b = append(b, m.Spec.Digest[:]...)
	b = m.Result.AppendPostcard(b)
	b = postcard.AppendLen(b, MaxOutputs)
	ref := wire.CasObjectRef{Algorithm: wire.DigestBLAKE3, Digest: wire.Digest{1}, Size: 5}
	b = ref.AppendPostcard(b)
	at := len(b)
	b = append(b, 0x7f) // no such DigestAlgorithm
	var got AttemptCompletionV1
	d := postcard.NewDecoder(b)
	got.DecodePostcard(&d)
	var pe *postcard.Error
	if !errors.As(d.Err(), &pe) || pe.Code != postcard.CodeBadEnum || pe.Offset != at {
		t.Fatalf("%v, want a bad enum at offset %d", d.Err(), at)
	}
}

// slicesWithin reports the first slice reachable from v whose capacity is
// above limit.
func slicesWithin(v reflect.Value, limit int) (string, bool) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return "", true
		}
		return slicesWithin(v.Elem(), limit)
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if p, ok := slicesWithin(v.Field(i), limit); !ok {
				return v.Type().Field(i).Name + "." + p, false
			}
		}
	case reflect.Slice:
		if v.Cap() > limit {
			return "", false
		}
		for i := 0; i < v.Len(); i++ {
			if p, ok := slicesWithin(v.Index(i), limit); !ok {
				return p, false
			}
		}
	case reflect.Array:
		for i := 0; i < v.Len(); i++ {
			if p, ok := slicesWithin(v.Index(i), limit); !ok {
				return p, false
			}
		}
	}
	return "", true
}
