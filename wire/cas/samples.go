package cas

import (
	"github.com/oklog/ulid/v2"

	"forgeyard.dev/transport/wire"
)

// sampleULID returns a fixed ULID: the timestamp 2026-01-01T00:00:00Z and ten
// bytes derived from tag.
func sampleULID(tag byte) ulid.ULID {
	u := ulid.ULID{0x01, 0x9b, 0x77, 0x2a, 0x3c, 0x00}
	for i := 6; i < len(u); i++ {
		u[i] = tag ^ byte(i*0x11)
	}
	return u
}

// sampleRef returns a fixed object reference whose digest bytes derive from
// tag.
func sampleRef(alg wire.DigestAlgorithm, tag byte, size uint64) wire.CasObjectRef {
	r := wire.CasObjectRef{Algorithm: alg, Size: size}
	for i := range r.Digest {
		r.Digest[i] = tag + byte(i*7)
	}
	return r
}

// Samples returns one deterministic, fully populated, valid instance of every
// cas message, plus extra instances so that every enum variant appears. Ids
// and digests are fixed; nothing depends on the clock or randomness. Each
// call returns fresh values.
func Samples() []wire.Message {
	attempt := wire.JobAttemptId{ULID: sampleULID(0x31)}
	lease := wire.LeaseId{ULID: sampleULID(0x32)}
	src := sampleRef(wire.DigestSHA256, 0x10, 1<<20)
	tool := sampleRef(wire.DigestBLAKE3, 0x20, 300)
	out := sampleRef(wire.DigestBLAKE3, 0x30, 0)
	m := []wire.Message{
		&NeedObjectsV1{Lease: lease, Objects: []wire.CasObjectRef{src, tool}},
		&MissingObjectsV1{Lease: lease, Objects: []wire.CasObjectRef{tool}},
		&CasObjectStreamHeaderV1{Lease: lease, Object: src, Offset: 0, Length: src.Size, Compression: CasCompressionNone},
		&CasObjectStreamHeaderV1{Lease: lease, Object: src, Offset: 4096, Length: src.Size - 4096, Compression: CasCompressionFlate},
		&CasRangeResumeRequestV1{Lease: lease, Object: src, VerifiedOffset: 4096},
		&CasFetchRequestV1{Lease: lease, Object: tool, Offset: 100},
	}
	for o := CasOutcome(0); o < numCasOutcomes; o++ {
		ack := &CasObjectAckV1{Lease: lease, Object: src, Outcome: o, VerifiedOffset: 4096}
		if o == CasVerified {
			ack.VerifiedOffset = src.Size
		}
		m = append(m, ack)
	}
	return append(m, &OutputsFinalizedV1{Attempt: attempt, Lease: lease, Outputs: []wire.CasObjectRef{out, tool}})
}
