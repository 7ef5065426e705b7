package signer_test

import (
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"forgeyard.dev/transport/semantics/signer"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/signing"
)

// Example: a worker with one file key signs a request attested by the
// policy authority it trusts, and refuses the same request once the
// subject no longer matches the attestation.
func Example() {
	dir, _ := os.MkdirTemp("", "signer-example")
	defer os.RemoveAll(dir)
	key, err := signer.GenerateKeyFile(filepath.Join(dir, "release.pem"), "release-ed25519", signing.Ed25519)
	if err != nil {
		panic(err)
	}
	authPub, authPriv, _ := ed25519.GenerateKey(nil)
	w, err := signer.New(signer.Config{Keys: []signer.Key{key},
		Policy: signer.Policy{Authorities: map[string]ed25519.PublicKey{"release/v1": authPub}}})
	if err != nil {
		panic(err)
	}
	fmt.Println("labels:", w.Labels())

	artifact := []byte("forgeyard 1.0 tarball")
	now := uint64(time.Now().UnixMilli())
	req := &signing.SignRequestV1{KeyRef: "release-ed25519", Algorithm: signing.Ed25519,
		Subject:      sha256.Sum256([]byte("provenance statement")),
		MaterialRefs: []wire.CasObjectRef{{Algorithm: wire.DigestSHA256, Digest: sha256.Sum256(artifact), Size: uint64(len(artifact))}},
		Policy:       signing.PolicyProofV1{PolicyID: "release/v1", IssuedAtMs: now, ExpiresAtMs: now + 60_000}}
	signer.Attest(authPriv, req) // the policy authority's part

	resp := w.Sign(req)
	fmt.Println(resp.Outcome.Kind, signer.Verify(req.Algorithm, key.Public(), req.Subject[:], resp.Outcome.Signature))

	req.Subject[0] ^= 1 // not what the authority attested
	resp = w.Sign(req)
	fmt.Println(resp.Outcome.Kind, signer.ParseRefusal(resp.Outcome.Reason))
	// Output:
	// labels: [signing-key=release-ed25519]
	// Signed true
	// Rejected bad-attestation
}
