package signing

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

const (
	testFamily = wire.FamilySigning
	testPrefix = "signing."
)

// validRequest returns a fresh valid request to mutate.
func validRequest() *SignRequestV1 {
	return Samples()[0].(*SignRequestV1)
}

func signed(sig []byte, chain ...[]byte) *SignResponseV1 {
	return &SignResponseV1{Outcome: SignOutcomeV1{Kind: SignSigned, Signature: sig, Chain: chain}}
}

func refs(n int) []wire.CasObjectRef {
	r := make([]wire.CasObjectRef, n)
	for i := range r {
		r[i] = wire.CasObjectRef{Algorithm: wire.DigestBLAKE3, Size: math.MaxUint64}
		copy(r[i].Digest[:], sampleBytes(byte(i+1), 32))
	}
	return r
}

func badEncodings() []badEncoding {
	with := func(f func(m *SignRequestV1)) *SignRequestV1 { m := validRequest(); f(m); return m }
	return []badEncoding{
		{"key ref", with(func(m *SignRequestV1) { m.KeyRef = strings.Repeat("k", MaxKeyRef+1) }), postcard.ErrLengthOverBound},
		{"algorithm", with(func(m *SignRequestV1) { m.Algorithm = numSignatureAlgorithms }), postcard.ErrBadEnum},
		{"material refs", with(func(m *SignRequestV1) { m.MaterialRefs = refs(MaxMaterialRefs + 1) }), postcard.ErrLengthOverBound},
		{"material ref algorithm", with(func(m *SignRequestV1) { m.MaterialRefs[0].Algorithm = 2 }), postcard.ErrBadEnum},
		{"policy id", with(func(m *SignRequestV1) { m.Policy.PolicyID = strings.Repeat("p", MaxPolicyID+1) }), postcard.ErrLengthOverBound},
		{"attestation", with(func(m *SignRequestV1) { m.Policy.Attestation = make([]byte, MaxAttestation+1) }), postcard.ErrLengthOverBound},
		{"outcome", &SignResponseV1{Outcome: SignOutcomeV1{Kind: numSignOutcomes}}, postcard.ErrBadEnum},
		{"signature", signed(make([]byte, MaxSignature+1)), postcard.ErrLengthOverBound},
		{"chain length", signed([]byte{1}, [][]byte{{1}, {2}, {3}, {4}, {5}}...), postcard.ErrLengthOverBound},
		{"chain cert", signed([]byte{1}, make([]byte, MaxChainCert+1)), postcard.ErrLengthOverBound},
		{"reason", &SignResponseV1{Outcome: SignOutcomeV1{Kind: SignRejected, Reason: strings.Repeat("r", MaxReason+1)}}, postcard.ErrLengthOverBound},
	}
}

func invalidMessages() []invalidMessage {
	with := func(f func(m *SignRequestV1)) *SignRequestV1 { m := validRequest(); f(m); return m }
	return []invalidMessage{
		{"empty key ref", with(func(m *SignRequestV1) { m.KeyRef = "" })},
		{"key ref UTF-8", with(func(m *SignRequestV1) { m.KeyRef = "\xff" })},
		{"algorithm", with(func(m *SignRequestV1) { m.Algorithm = 2 })},
		{"zero subject", with(func(m *SignRequestV1) { m.Subject = wire.Digest{} })},
		{"too many refs", with(func(m *SignRequestV1) { m.MaterialRefs = refs(MaxMaterialRefs + 1) })},
		{"zero ref digest", with(func(m *SignRequestV1) { m.MaterialRefs[1].Digest = wire.Digest{} })},
		{"empty policy id", with(func(m *SignRequestV1) { m.Policy.PolicyID = "" })},
		{"empty attestation", with(func(m *SignRequestV1) { m.Policy.Attestation = nil })},
		{"attestation over bound", with(func(m *SignRequestV1) { m.Policy.Attestation = make([]byte, MaxAttestation+1) })},
		{"proof expires at issue", with(func(m *SignRequestV1) { m.Policy.ExpiresAtMs = m.Policy.IssuedAtMs })},
		{"outcome", &SignResponseV1{Outcome: SignOutcomeV1{Kind: 2}}},
		{"empty signature", signed(nil)},
		{"signature over bound", signed(make([]byte, MaxSignature+1))},
		{"chain too long", signed([]byte{1}, [][]byte{{1}, {2}, {3}, {4}, {5}}...)},
		{"empty chain cert", signed([]byte{1}, nil)},
		{"signed with reason", &SignResponseV1{Outcome: SignOutcomeV1{Kind: SignSigned, Signature: []byte{1}, Reason: "x"}}},
		{"rejected without reason", &SignResponseV1{Outcome: SignOutcomeV1{Kind: SignRejected}}},
		{"rejected with signature", &SignResponseV1{Outcome: SignOutcomeV1{Kind: SignRejected, Reason: "no", Signature: []byte{1}}}},
		{"reason over bound", &SignResponseV1{Outcome: SignOutcomeV1{Kind: SignRejected, Reason: strings.Repeat("r", MaxReason+1)}}},
	}
}

func maximalMessages() []wire.Message {
	var subject wire.Digest
	copy(subject[:], bytes.Repeat([]byte{0xff}, 32))
	chain := make([][]byte, MaxChain)
	for i := range chain {
		chain[i] = bytes.Repeat([]byte{byte(i + 1)}, MaxChainCert)
	}
	return []wire.Message{
		&SignRequestV1{
			KeyRef: strings.Repeat("k", MaxKeyRef), Algorithm: EcdsaP256Sha256, Subject: subject,
			MaterialRefs: refs(MaxMaterialRefs),
			Policy: PolicyProofV1{PolicyID: strings.Repeat("p", MaxPolicyID), Attestation: bytes.Repeat([]byte{7}, MaxAttestation),
				IssuedAtMs: math.MaxUint64 - 1, ExpiresAtMs: math.MaxUint64},
		},
		signed(bytes.Repeat([]byte{9}, MaxSignature), chain...),
		&SignResponseV1{Outcome: SignOutcomeV1{Kind: SignRejected, Reason: strings.Repeat("r", MaxReason)}},
	}
}

func TestEnumStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{Ed25519.String(), "Ed25519"}, {EcdsaP256Sha256.String(), "EcdsaP256Sha256"},
		{SignatureAlgorithm(2).String(), "SignatureAlgorithm(2)"},
		{SignSigned.String(), "Signed"}, {SignRejected.String(), "Rejected"}, {SignOutcomeKind(2).String(), "SignOutcomeKind(2)"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// Decoded byte fields are copies: changing the input afterwards leaves the
// decoded message unchanged.
func TestDecodedBytesDoNotAlias(t *testing.T) {
	m := Samples()[2].(*SignResponseV1)
	body := m.AppendPostcard(nil)
	got, err := decodeBody(t, MsgSignResponse, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := range body {
		body[i] ^= 0xff
	}
	if g := got.(*SignResponseV1); !bytes.Equal(g.Outcome.Signature, m.Outcome.Signature) || !bytes.Equal(g.Outcome.Chain[1], m.Outcome.Chain[1]) {
		t.Fatal("decoded bytes alias the input")
	}
}
