package signing

import (
	"log/slog"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/check"
	"forgeyard.dev/transport/wire/internal/enum"
	"forgeyard.dev/transport/wire/internal/seq"
	"forgeyard.dev/transport/wire/postcard"
)

// SignatureAlgorithm is the signature scheme requested. Postcard enum.
type SignatureAlgorithm uint32

// Signature algorithms.
const (
	Ed25519         SignatureAlgorithm = 0 // RFC 8032 Ed25519
	EcdsaP256Sha256 SignatureAlgorithm = 1 // ECDSA over P-256 with SHA-256, ASN.1 DER signature

	numSignatureAlgorithms = 2
)

// String returns the algorithm's name (Ed25519, EcdsaP256Sha256).
func (a SignatureAlgorithm) String() string {
	return enum.Name(signatureAlgorithmNames[:], a, "SignatureAlgorithm")
}

var signatureAlgorithmNames = [...]string{Ed25519: "Ed25519", EcdsaP256Sha256: "EcdsaP256Sha256"}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (a SignatureAlgorithm) LogValue() slog.Value { return slog.StringValue(a.String()) }

// PolicyProofV1 is the evidence that a signing policy authorizes the request
// (§99): the policy's id and an attestation issued for this request by the
// policy authority, valid in [IssuedAtMs, ExpiresAtMs) (unix milliseconds).
// The worker verifies the attestation; this type only carries it.
//
//	struct PolicyProofV1 {
//	    policy_id: String,      // 1..=128 bytes
//	    attestation: Bytes,     // 1..=8192 bytes
//	    issued_at_ms: u64,
//	    expires_at_ms: u64,     // > issued_at_ms
//	}
type PolicyProofV1 struct {
	PolicyID    string
	Attestation []byte
	IssuedAtMs  uint64
	ExpiresAtMs uint64
}

func (p *PolicyProofV1) appendPostcard(b []byte) []byte {
	b = postcard.AppendString(b, p.PolicyID)
	b = postcard.AppendBytes(b, p.Attestation)
	b = postcard.AppendU64(b, p.IssuedAtMs)
	return postcard.AppendU64(b, p.ExpiresAtMs)
}

func (p *PolicyProofV1) decodePostcard(d *postcard.Decoder) {
	p.PolicyID = d.String(MaxPolicyID)
	p.Attestation = d.Bytes(MaxAttestation)
	p.IssuedAtMs = d.U64()
	p.ExpiresAtMs = d.U64()
}

func (p *PolicyProofV1) validate() error {
	if !validText(p.PolicyID, MaxPolicyID) {
		return errInvalid("policy proof: policy id must be 1..=128 bytes of UTF-8")
	}
	if len(p.Attestation) == 0 || len(p.Attestation) > MaxAttestation {
		return errInvalid("policy proof: attestation must be 1..=8192 bytes")
	}
	if p.ExpiresAtMs <= p.IssuedAtMs {
		return errInvalid("policy proof: expires before it is issued")
	}
	return nil
}

// SignRequestV1 asks a signing worker to sign Subject with the key named by
// KeyRef (§99). MaterialRefs are the CAS objects the subject digest covers
// (so the worker or an auditor can check what was signed); Policy authorizes
// the request.
//
//	struct SignRequestV1 {
//	    key_ref: String,                     // 1..=128 bytes: a key name, never key material
//	    algorithm: SignatureAlgorithm,       // Ed25519=0, EcdsaP256Sha256=1
//	    subject: [u8;32],                    // the digest to sign
//	    material_refs: Vec<CasObjectRef>,    // ≤ 64
//	    policy: PolicyProofV1,
//	}
type SignRequestV1 struct {
	KeyRef       string
	Algorithm    SignatureAlgorithm
	Subject      wire.Digest
	MaterialRefs []wire.CasObjectRef
	Policy       PolicyProofV1
}

// MessageType implements wire.Message.
func (*SignRequestV1) MessageType() wire.MessageTypeId { return MsgSignRequest }

// AppendPostcard implements wire.Message.
func (m *SignRequestV1) AppendPostcard(b []byte) []byte {
	b = postcard.AppendString(b, m.KeyRef)
	b = postcard.AppendVariant(b, uint32(m.Algorithm))
	b = append(b, m.Subject[:]...)
	b = seq.Append(b, m.MaterialRefs, (*wire.CasObjectRef).AppendPostcard)
	return m.Policy.appendPostcard(b)
}

// DecodePostcard implements wire.Message. It reuses the capacity of
// m.MaterialRefs; the attestation is copied.
func (m *SignRequestV1) DecodePostcard(d *postcard.Decoder) {
	m.KeyRef = d.String(MaxKeyRef)
	m.Algorithm = SignatureAlgorithm(d.Variant(numSignatureAlgorithms))
	wire.ReadDigest(d, &m.Subject)
	for r := range seq.Decode(d, &m.MaterialRefs, MaxMaterialRefs, wire.CasObjectRefMinSize) {
		r.DecodePostcard(d)
	}
	m.Policy.decodePostcard(d)
}

// Validate implements wire.Message: a key reference, a known algorithm, a
// non-zero subject, at most MaxMaterialRefs valid references, and a valid
// policy proof are required.
func (m *SignRequestV1) Validate() error {
	if !validText(m.KeyRef, MaxKeyRef) {
		return errInvalid("sign request: key ref must be 1..=128 bytes of UTF-8")
	}
	if m.Algorithm >= numSignatureAlgorithms {
		return errInvalid("sign request: unknown algorithm")
	}
	if m.Subject.IsZero() {
		return errInvalid("sign request: subject digest is required")
	}
	if len(m.MaterialRefs) > MaxMaterialRefs {
		return errInvalid("sign request: more than 64 material refs")
	}
	for i := range m.MaterialRefs {
		if !check.ValidRef(&m.MaterialRefs[i]) {
			return errInvalid("sign request: material ref with unknown algorithm or zero digest")
		}
	}
	return m.Policy.validate()
}
