package cas

import (
	"math"
	"testing"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/sample"
	"forgeyard.dev/transport/wire/postcard"
)

const (
	testFamily = wire.FamilyCas
	testPrefix = "cas."
)

var (
	tAttempt = wire.JobAttemptId{ULID: sample.ULID(1)}
	tLease   = wire.LeaseId{ULID: sample.ULID(2)}
	tRef     = sample.Ref(wire.DigestSHA256, 3, 1000)
)

func refs(n int) []wire.CasObjectRef {
	r := make([]wire.CasObjectRef, n)
	for i := range r {
		r[i] = sample.Ref(wire.DigestBLAKE3, byte(i+1), math.MaxUint64)
	}
	return r
}

func badEncodings() []badEncoding {
	badAlg := tRef
	badAlg.Algorithm = 2
	return []badEncoding{
		{"need over MaxBatch", &NeedObjectsV1{Lease: tLease, Objects: refs(MaxBatch + 1)}, postcard.ErrLengthOverBound},
		{"missing over MaxBatch", &MissingObjectsV1{Lease: tLease, Objects: refs(MaxBatch + 1)}, postcard.ErrLengthOverBound},
		{"outputs over MaxBatch", &OutputsFinalizedV1{Attempt: tAttempt, Lease: tLease, Outputs: refs(MaxBatch + 1)}, postcard.ErrLengthOverBound},
		{"need digest algorithm", &NeedObjectsV1{Lease: tLease, Objects: []wire.CasObjectRef{badAlg}}, postcard.ErrBadEnum},
		{"header compression", &CasObjectStreamHeaderV1{Lease: tLease, Object: tRef, Compression: numCasCompressions}, postcard.ErrBadEnum},
		{"header digest algorithm", &CasObjectStreamHeaderV1{Lease: tLease, Object: badAlg}, postcard.ErrBadEnum},
		{"ack outcome", &CasObjectAckV1{Lease: tLease, Object: tRef, Outcome: numCasOutcomes}, postcard.ErrBadEnum},
	}
}

func invalidMessages() []invalidMessage {
	zeroDigest := tRef
	zeroDigest.Digest = wire.Digest{}
	big := sample.Ref(wire.DigestSHA256, 3, math.MaxUint64)
	return []invalidMessage{
		{"need zero lease", &NeedObjectsV1{Objects: refs(1)}},
		{"need empty", &NeedObjectsV1{Lease: tLease}},
		{"need zero digest", &NeedObjectsV1{Lease: tLease, Objects: []wire.CasObjectRef{zeroDigest}}},
		{"need over MaxBatch", &NeedObjectsV1{Lease: tLease, Objects: refs(MaxBatch + 1)}},
		{"missing zero lease", &MissingObjectsV1{}},
		{"missing bad algorithm", &MissingObjectsV1{Lease: tLease, Objects: []wire.CasObjectRef{{Algorithm: 5, Digest: tRef.Digest}}}},
		{"header zero lease", &CasObjectStreamHeaderV1{Object: tRef}},
		{"header zero digest", &CasObjectStreamHeaderV1{Lease: tLease, Object: zeroDigest}},
		{"header offset beyond size", &CasObjectStreamHeaderV1{Lease: tLease, Object: tRef, Offset: 1001}},
		{"header range beyond size", &CasObjectStreamHeaderV1{Lease: tLease, Object: tRef, Offset: 500, Length: 501}},
		{"header range overflows u64", &CasObjectStreamHeaderV1{Lease: tLease, Object: big, Offset: 2, Length: math.MaxUint64 - 1}},
		{"header compression", &CasObjectStreamHeaderV1{Lease: tLease, Object: tRef, Compression: 2}},
		{"resume zero lease", &CasRangeResumeRequestV1{Object: tRef}},
		{"resume zero digest", &CasRangeResumeRequestV1{Lease: tLease, Object: zeroDigest}},
		{"resume beyond size", &CasRangeResumeRequestV1{Lease: tLease, Object: tRef, VerifiedOffset: 1001}},
		{"fetch zero lease", &CasFetchRequestV1{Object: tRef}},
		{"fetch zero digest", &CasFetchRequestV1{Lease: tLease, Object: zeroDigest}},
		{"fetch beyond size", &CasFetchRequestV1{Lease: tLease, Object: tRef, Offset: 1001}},
		{"ack zero lease", &CasObjectAckV1{Object: tRef, Outcome: CasAborted}},
		{"ack zero digest", &CasObjectAckV1{Lease: tLease, Object: zeroDigest, Outcome: CasAborted}},
		{"ack outcome", &CasObjectAckV1{Lease: tLease, Object: tRef, Outcome: 6}},
		{"ack beyond size", &CasObjectAckV1{Lease: tLease, Object: tRef, Outcome: CasAborted, VerifiedOffset: 1001}},
		{"ack verified partial", &CasObjectAckV1{Lease: tLease, Object: tRef, Outcome: CasVerified, VerifiedOffset: 999}},
		{"outputs zero attempt", &OutputsFinalizedV1{Lease: tLease}},
		{"outputs zero lease", &OutputsFinalizedV1{Attempt: tAttempt}},
		{"outputs zero digest", &OutputsFinalizedV1{Attempt: tAttempt, Lease: tLease, Outputs: []wire.CasObjectRef{zeroDigest}}},
	}
}

func maximalMessages() []wire.Message {
	big := sample.Ref(wire.DigestBLAKE3, 9, math.MaxUint64)
	return []wire.Message{
		&NeedObjectsV1{Lease: tLease, Objects: refs(MaxBatch)},
		&MissingObjectsV1{Lease: tLease, Objects: refs(MaxBatch)},
		&CasObjectStreamHeaderV1{Lease: tLease, Object: big, Offset: math.MaxUint64 / 2, Length: math.MaxUint64 / 2, Compression: CasCompressionFlate},
		&CasRangeResumeRequestV1{Lease: tLease, Object: big, VerifiedOffset: math.MaxUint64},
		&CasFetchRequestV1{Lease: tLease, Object: big, Offset: math.MaxUint64},
		&CasObjectAckV1{Lease: tLease, Object: big, Outcome: CasAborted, VerifiedOffset: math.MaxUint64},
		&OutputsFinalizedV1{Attempt: tAttempt, Lease: tLease, Outputs: refs(MaxBatch)},
	}
}

func TestEnumStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{CasCompressionNone.String(), "None"}, {CasCompressionFlate.String(), "Flate"},
		{CasCompression(2).String(), "CasCompression(2)"},
		{CasVerified.String(), "Verified"}, {CasDigestMismatch.String(), "DigestMismatch"},
		{CasForbidden.String(), "Forbidden"}, {CasNotFound.String(), "NotFound"},
		{CasSizeMismatch.String(), "SizeMismatch"}, {CasAborted.String(), "Aborted"},
		{CasOutcome(6).String(), "CasOutcome(6)"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// A count that cannot fit the remaining input is rejected before allocating
// the slice; the only allocation is the *postcard.Error itself.
func TestHugeCountRejectedWithoutAllocating(t *testing.T) {
	body := append(tLease.ULID[:], postcard.AppendLen(nil, MaxBatch)...)
	var m NeedObjectsV1
	n := testing.AllocsPerRun(20, func() {
		d := postcard.NewDecoder(body)
		m.DecodePostcard(&d)
		if d.Err() == nil {
			t.Fatal("accepted a count beyond the input")
		}
	})
	if n > 1 || cap(m.Objects) != 0 {
		t.Fatalf("allocated %.1f times, objects cap %d", n, cap(m.Objects))
	}
}

// Decoding into the same value reuses its slice.
func TestDecodeReusesCapacity(t *testing.T) {
	body := (&NeedObjectsV1{Lease: tLease, Objects: refs(8)}).AppendPostcard(nil)
	m := &NeedObjectsV1{Objects: make([]wire.CasObjectRef, 0, 8)}
	if n := testing.AllocsPerRun(20, func() {
		d := postcard.NewDecoder(body)
		m.DecodePostcard(&d)
		if err := d.Finish(); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("allocated %.1f times", n)
	}
}
