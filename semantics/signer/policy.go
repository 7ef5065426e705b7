package signer

import (
	"crypto/ed25519"
	"time"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
	"forgeyard.dev/transport/wire/signing"
)

// DefaultMaxProofLifetime bounds a policy proof's validity when
// Policy.MaxProofLifetime is zero.
const DefaultMaxProofLifetime = 15 * time.Minute

// attestationContext separates policy attestations from every other use of
// the authority's key.
const attestationContext = "forgeyard-signing-policy-attestation-v1\x00"

// Policy is what a signing worker checks before it signs (see the package
// doc). The zero value trusts no policy, so it refuses every request.
type Policy struct {
	// Authorities maps a policy id to the Ed25519 public key of the
	// authority whose attestations of that policy the worker accepts.
	Authorities map[string]ed25519.PublicKey
	// MaterialAlgorithms are the digest algorithms material refs may use;
	// empty allows SHA-256 and BLAKE3.
	MaterialAlgorithms []wire.DigestAlgorithm
	// RequireMaterial refuses requests without material refs.
	RequireMaterial bool
	// MaxProofLifetime bounds ExpiresAtMs − IssuedAtMs; 0 →
	// DefaultMaxProofLifetime.
	MaxProofLifetime time.Duration
	// ClockSkew is tolerated on both ends of a proof's validity.
	ClockSkew time.Duration
}

// AttestationMessage returns the bytes a policy authority signs to attest
// req: a fixed context string, then the Postcard encoding of policy id, key
// ref, algorithm, subject, material refs, issued_at_ms and expires_at_ms.
// The attestation itself is not part of it.
func AttestationMessage(req *signing.SignRequestV1) []byte {
	b := []byte(attestationContext)
	b = postcard.AppendString(b, req.Policy.PolicyID)
	b = postcard.AppendString(b, req.KeyRef)
	b = postcard.AppendVariant(b, uint32(req.Algorithm))
	b = append(b, req.Subject[:]...)
	b = postcard.AppendLen(b, len(req.MaterialRefs))
	for i := range req.MaterialRefs {
		b = req.MaterialRefs[i].AppendPostcard(b)
	}
	b = postcard.AppendU64(b, req.Policy.IssuedAtMs)
	return postcard.AppendU64(b, req.Policy.ExpiresAtMs)
}

// Attest sets req.Policy.Attestation to the policy authority's signature
// over AttestationMessage(req). Set every other field first.
func Attest(authority ed25519.PrivateKey, req *signing.SignRequestV1) {
	req.Policy.Attestation = ed25519.Sign(authority, AttestationMessage(req))
}

// check returns "" when p allows req for key at now, else the refusal.
func (p *Policy) check(req *signing.SignRequestV1, key Key, ok bool, now time.Time) RefusalCode {
	if !ok {
		return RefuseUnknownKey
	}
	if req.Algorithm != key.Algorithm {
		return RefuseAlgorithm
	}
	pub, trusted := p.Authorities[req.Policy.PolicyID]
	if !trusted || len(pub) != ed25519.PublicKeySize {
		return RefuseUnknownPolicy
	}
	if !ed25519.Verify(pub, AttestationMessage(req), req.Policy.Attestation) {
		return RefuseBadAttestation
	}
	life := p.MaxProofLifetime
	if life <= 0 {
		life = DefaultMaxProofLifetime
	}
	pr := &req.Policy
	if time.Duration(pr.ExpiresAtMs-pr.IssuedAtMs)*time.Millisecond > life {
		return RefuseProofTooLong
	}
	ms := now.UnixMilli()
	skew := p.ClockSkew.Milliseconds()
	if ms+skew < int64(pr.IssuedAtMs) || ms-skew >= int64(pr.ExpiresAtMs) {
		return RefuseProofNotValidNow
	}
	if p.RequireMaterial && len(req.MaterialRefs) == 0 {
		return RefuseMaterial
	}
	for i := range req.MaterialRefs {
		if !p.materialAllowed(req.MaterialRefs[i].Algorithm) {
			return RefuseMaterial
		}
	}
	return ""
}

func (p *Policy) materialAllowed(a wire.DigestAlgorithm) bool {
	if len(p.MaterialAlgorithms) == 0 {
		return a == wire.DigestSHA256 || a == wire.DigestBLAKE3
	}
	for _, x := range p.MaterialAlgorithms {
		if x == a {
			return true
		}
	}
	return false
}
