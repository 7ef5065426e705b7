package session

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"errors"
	"fmt"

	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// KeyProofContext is the domain-separation prefix of the registration key
// proof.
const KeyProofContext = "forgeyard-register-v1\x00"

// ErrBadKeyProof reports a key proof that does not verify with the
// certificate's key, or a key type this package cannot check.
var ErrBadKeyProof = errors.New("session: registration key proof does not verify")

// KeyProofMessage returns the signed bytes of a registration key proof:
//
//	"forgeyard-register-v1\x00" ‖ challenge (32) ‖ transport_session (16) ‖ agent_session (16)
//
// The challenge and transport session come from HelloAckV1, so a proof is
// bound to one transport and cannot be replayed on another.
func KeyProofMessage(challenge [agentwire.ChallengeSize]byte, transport wire.TransportSessionId, session wire.AgentSessionId) []byte {
	b := make([]byte, 0, len(KeyProofContext)+agentwire.ChallengeSize+32)
	b = append(b, KeyProofContext...)
	b = append(b, challenge[:]...)
	b = append(b, transport.ULID[:]...)
	return append(b, session.ULID[:]...)
}

// SignKeyProof signs the key proof with the agent's certificate key:
// Ed25519 signs the message itself; ECDSA and RSA (PKCS#1 v1.5) sign its
// SHA-256 digest.
func SignKeyProof(signer crypto.Signer, challenge [agentwire.ChallengeSize]byte, transport wire.TransportSessionId, session wire.AgentSessionId) ([]byte, error) {
	if signer == nil {
		return nil, errors.New("session: nil signer")
	}
	msg := KeyProofMessage(challenge, transport, session)
	switch signer.Public().(type) {
	case ed25519.PublicKey:
		return signer.Sign(rand.Reader, msg, crypto.Hash(0))
	case *ecdsa.PublicKey, *rsa.PublicKey:
		sum := sha256.Sum256(msg)
		return signer.Sign(rand.Reader, sum[:], crypto.SHA256)
	default:
		return nil, fmt.Errorf("session: unsupported key type %T for the key proof", signer.Public())
	}
}

// VerifyKeyProof checks proof against the certificate public key pub. It
// returns nil or ErrBadKeyProof.
func VerifyKeyProof(pub crypto.PublicKey, proof []byte, challenge [agentwire.ChallengeSize]byte, transport wire.TransportSessionId, session wire.AgentSessionId) error {
	msg := KeyProofMessage(challenge, transport, session)
	sum := sha256.Sum256(msg)
	ok := false
	switch k := pub.(type) {
	case ed25519.PublicKey:
		ok = len(k) == ed25519.PublicKeySize && ed25519.Verify(k, msg, proof)
	case *ecdsa.PublicKey:
		ok = ecdsa.VerifyASN1(k, sum[:], proof)
	case *rsa.PublicKey:
		ok = rsa.VerifyPKCS1v15(k, crypto.SHA256, sum[:], proof) == nil
	}
	if !ok {
		return ErrBadKeyProof
	}
	return nil
}
