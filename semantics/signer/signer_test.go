package signer

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"path/filepath"
	"testing"
	"time"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/signing"
)

var t0 = time.UnixMilli(1767225600000)

func testWorker(t *testing.T, p Policy) (*Worker, ed25519.PrivateKey, map[string]Key) {
	t.Helper()
	_, edPriv, _ := ed25519.GenerateKey(rand.Reader)
	ecPriv, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ed, err := NewKey("ed", edPriv)
	if err != nil {
		t.Fatal(err)
	}
	ec, err := NewKey("ec", ecPriv)
	if err != nil {
		t.Fatal(err)
	}
	pub, auth, _ := ed25519.GenerateKey(rand.Reader)
	if p.Authorities == nil {
		p.Authorities = map[string]ed25519.PublicKey{"pol": pub}
	}
	w, err := New(Config{Keys: []Key{ed, ec}, Policy: p, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	return w, auth, map[string]Key{"ed": ed, "ec": ec}
}

func req(auth ed25519.PrivateKey, ref string, alg signing.SignatureAlgorithm, mut func(*signing.SignRequestV1)) *signing.SignRequestV1 {
	r := &signing.SignRequestV1{KeyRef: ref, Algorithm: alg, Subject: sha256.Sum256([]byte(ref)),
		MaterialRefs: []wire.CasObjectRef{{Algorithm: wire.DigestSHA256, Digest: wire.Digest{1}, Size: 1}},
		Policy:       signing.PolicyProofV1{PolicyID: "pol", IssuedAtMs: uint64(t0.UnixMilli()) - 10, ExpiresAtMs: uint64(t0.UnixMilli()) + 60_000}}
	if mut != nil {
		mut(r)
	}
	Attest(auth, r)
	return r
}

func TestSignBothAlgorithms(t *testing.T) {
	w, auth, keys := testWorker(t, Policy{})
	for ref, alg := range map[string]signing.SignatureAlgorithm{"ed": signing.Ed25519, "ec": signing.EcdsaP256Sha256} {
		r := req(auth, ref, alg, nil)
		resp := w.Sign(r)
		if err := resp.Validate(); err != nil {
			t.Fatal(err)
		}
		if resp.Outcome.Kind != signing.SignSigned || !Verify(alg, keys[ref].Public(), r.Subject[:], resp.Outcome.Signature) {
			t.Fatalf("%s: %+v", ref, resp.Outcome)
		}
		if Verify(alg, keys[map[string]string{"ed": "ec", "ec": "ed"}[ref]].Public(), r.Subject[:], resp.Outcome.Signature) {
			t.Fatalf("%s: verified with the other key", ref)
		}
	}
}

func TestPolicyRefusals(t *testing.T) {
	ms := uint64(t0.UnixMilli())
	for _, c := range []struct {
		name string
		p    Policy
		r    func(auth ed25519.PrivateKey) *signing.SignRequestV1
		want RefusalCode
	}{
		{"unknown key", Policy{}, func(a ed25519.PrivateKey) *signing.SignRequestV1 { return req(a, "zz", signing.Ed25519, nil) }, RefuseUnknownKey},
		{"algorithm", Policy{}, func(a ed25519.PrivateKey) *signing.SignRequestV1 { return req(a, "ed", signing.EcdsaP256Sha256, nil) }, RefuseAlgorithm},
		{"policy", Policy{}, func(a ed25519.PrivateKey) *signing.SignRequestV1 {
			return req(a, "ed", signing.Ed25519, func(r *signing.SignRequestV1) { r.Policy.PolicyID = "other" })
		}, RefuseUnknownPolicy},
		{"attestation", Policy{}, func(a ed25519.PrivateKey) *signing.SignRequestV1 {
			r := req(a, "ed", signing.Ed25519, nil)
			r.MaterialRefs[0].Size++
			return r
		}, RefuseBadAttestation},
		{"not yet valid", Policy{}, func(a ed25519.PrivateKey) *signing.SignRequestV1 {
			return req(a, "ed", signing.Ed25519, func(r *signing.SignRequestV1) { r.Policy.IssuedAtMs, r.Policy.ExpiresAtMs = ms+1000, ms+2000 })
		}, RefuseProofNotValidNow},
		{"expired", Policy{}, func(a ed25519.PrivateKey) *signing.SignRequestV1 {
			return req(a, "ed", signing.Ed25519, func(r *signing.SignRequestV1) { r.Policy.IssuedAtMs, r.Policy.ExpiresAtMs = ms-2000, ms })
		}, RefuseProofNotValidNow},
		{"too long", Policy{MaxProofLifetime: time.Minute}, func(a ed25519.PrivateKey) *signing.SignRequestV1 {
			return req(a, "ed", signing.Ed25519, func(r *signing.SignRequestV1) { r.Policy.ExpiresAtMs = ms + 3_600_000 })
		}, RefuseProofTooLong},
		{"material required", Policy{RequireMaterial: true}, func(a ed25519.PrivateKey) *signing.SignRequestV1 {
			return req(a, "ed", signing.Ed25519, func(r *signing.SignRequestV1) { r.MaterialRefs = nil })
		}, RefuseMaterial},
		{"material algorithm", Policy{MaterialAlgorithms: []wire.DigestAlgorithm{wire.DigestBLAKE3}}, func(a ed25519.PrivateKey) *signing.SignRequestV1 {
			return req(a, "ed", signing.Ed25519, nil)
		}, RefuseMaterial},
	} {
		w, auth, _ := testWorker(t, c.p)
		resp := w.Sign(c.r(auth))
		if err := resp.Validate(); err != nil {
			t.Fatalf("%s: invalid response: %v", c.name, err)
		}
		if resp.Outcome.Kind != signing.SignRejected || ParseRefusal(resp.Outcome.Reason) != c.want || resp.Outcome.Reason != c.want.Reason() {
			t.Errorf("%s: %+v, want %s", c.name, resp.Outcome, c.want)
		}
		if st := w.Stats(); st.Refused != 1 || st.ByCode[c.want] != 1 || st.Signed != 0 {
			t.Errorf("%s: stats %+v", c.name, st)
		}
	}
}

// TestRefusalTextIsFixed: every reason is the code and its fixed text, so
// no internal error reaches the wire.
func TestRefusalTextIsFixed(t *testing.T) {
	for code := range refusalText {
		r := code.Reason()
		if ParseRefusal(r) != code || len(r) > signing.MaxReason {
			t.Errorf("%s: %q", code, r)
		}
	}
	if ParseRefusal("something else: x") != "" {
		t.Error("an unknown code parsed")
	}
}

func TestKeyFiles(t *testing.T) {
	dir := t.TempDir()
	if _, err := GenerateKeyFile(filepath.Join(dir, "k.pem"), "", signing.Ed25519); err != ErrKeyRef {
		t.Fatalf("empty ref: %v", err)
	}
	long := string(make([]byte, 53))
	if ValidKeyRef(long) {
		t.Fatal("a ref longer than a label can carry is valid")
	}
	if _, err := NewKey("r", ecdsaP384(t)); err != ErrKeyType {
		t.Fatalf("P-384 key: %v", err)
	}
}

func ecdsaP384(t *testing.T) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
