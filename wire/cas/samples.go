package cas

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/sample"
)

// Samples returns one deterministic, fully populated, valid instance of every
// cas message, plus extra instances so that every enum variant appears. Ids
// and digests are fixed; nothing depends on the clock or randomness. Each
// call returns fresh values.
func Samples() []wire.Message {
	attempt := wire.JobAttemptId{ULID: sample.ULID(0x31)}
	lease := wire.LeaseId{ULID: sample.ULID(0x32)}
	src := sample.Ref(wire.DigestSHA256, 0x10, 1<<20)
	tool := sample.Ref(wire.DigestBLAKE3, 0x20, 300)
	out := sample.Ref(wire.DigestBLAKE3, 0x30, 0)
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
