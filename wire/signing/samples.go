package signing

import "forgeyard.dev/transport/wire"

// sampleBytes returns n deterministic bytes derived from tag.
func sampleBytes(tag byte, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = tag + byte(i*13)
	}
	return p
}

// Samples returns one deterministic, fully populated, valid instance of every
// signing message, plus extra instances so that every enum variant appears.
// Nothing depends on the clock or randomness. Each call returns fresh values.
func Samples() []wire.Message {
	var subject wire.Digest
	copy(subject[:], sampleBytes(0x41, 32))
	ref := func(alg wire.DigestAlgorithm, tag byte, size uint64) wire.CasObjectRef {
		r := wire.CasObjectRef{Algorithm: alg, Size: size}
		copy(r.Digest[:], sampleBytes(tag, 32))
		return r
	}
	const t0 = 1767225600000 // 2026-01-01T00:00:00Z in unix ms
	policy := PolicyProofV1{
		PolicyID:    "release-signing/v3",
		Attestation: sampleBytes(0x51, 96),
		IssuedAtMs:  t0,
		ExpiresAtMs: t0 + 300_000,
	}
	return []wire.Message{
		&SignRequestV1{
			KeyRef:    "kms://forgeyard/release-ed25519",
			Algorithm: Ed25519,
			Subject:   subject,
			MaterialRefs: []wire.CasObjectRef{
				ref(wire.DigestSHA256, 0x61, 48_213_504),
				ref(wire.DigestBLAKE3, 0x62, 1_024),
			},
			Policy: policy,
		},
		&SignRequestV1{
			KeyRef:       "kms://forgeyard/attest-p256",
			Algorithm:    EcdsaP256Sha256,
			Subject:      subject,
			MaterialRefs: []wire.CasObjectRef{ref(wire.DigestSHA256, 0x63, 7)},
			Policy:       PolicyProofV1{PolicyID: "attest/v1", Attestation: sampleBytes(0x52, 40), IssuedAtMs: t0, ExpiresAtMs: t0 + 1},
		},
		&SignResponseV1{Outcome: SignOutcomeV1{
			Kind:      SignSigned,
			Signature: sampleBytes(0x71, 64),
			Chain:     [][]byte{sampleBytes(0x72, 300), sampleBytes(0x73, 280)},
		}},
		&SignResponseV1{Outcome: SignOutcomeV1{Kind: SignRejected, Reason: "policy release-signing/v3: proof expired"}},
	}
}
