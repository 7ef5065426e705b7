package signer

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unicode/utf8"

	"forgeyard.dev/transport/semantics/session"
	"forgeyard.dev/transport/wire/signing"
)

// Key is one signing key held by the worker: its ref (the name requests
// use), its algorithm and its private key. The private key never leaves
// the process.
type Key struct {
	Ref       string
	Algorithm signing.SignatureAlgorithm
	signer    crypto.Signer
}

// Errors of key files.
var (
	// ErrKeyFileMode: the key file is readable or writable by group or
	// others (it must be 0600 or stricter).
	ErrKeyFileMode = errors.New("signer: key file must not be accessible by group or others (chmod 0600)")
	// ErrKeyType: the key is neither Ed25519 nor ECDSA P-256.
	ErrKeyType = errors.New("signer: key must be Ed25519 or ECDSA P-256")
	// ErrKeyRef: the ref is empty, not UTF-8, or too long to advertise.
	ErrKeyRef = fmt.Errorf("signer: key ref must be 1..=%d bytes of UTF-8", session.MaxAdvertisedKeyRef)
)

// ValidKeyRef reports whether ref can name a worker key: 1..=
// session.MaxAdvertisedKeyRef bytes of UTF-8 (so it fits a capability
// label).
func ValidKeyRef(ref string) bool {
	return ref != "" && len(ref) <= session.MaxAdvertisedKeyRef && utf8.ValidString(ref)
}

// NewKey wraps a private key (ed25519.PrivateKey or *ecdsa.PrivateKey on
// P-256) as the worker key ref.
func NewKey(ref string, priv crypto.Signer) (Key, error) {
	if !ValidKeyRef(ref) {
		return Key{}, ErrKeyRef
	}
	switch k := priv.(type) {
	case ed25519.PrivateKey:
		return Key{Ref: ref, Algorithm: signing.Ed25519, signer: k}, nil
	case *ecdsa.PrivateKey:
		if k.Curve != elliptic.P256() {
			return Key{}, ErrKeyType
		}
		return Key{Ref: ref, Algorithm: signing.EcdsaP256Sha256, signer: k}, nil
	}
	return Key{}, ErrKeyType
}

// Public returns the key's public key (ed25519.PublicKey or
// *ecdsa.PublicKey).
func (k Key) Public() crypto.PublicKey { return k.signer.Public() }

// sign signs the 32-byte subject.
func (k Key) sign(subject []byte) ([]byte, error) {
	switch s := k.signer.(type) {
	case ed25519.PrivateKey:
		return ed25519.Sign(s, subject), nil
	case *ecdsa.PrivateKey:
		return ecdsa.SignASN1(rand.Reader, s, subject)
	}
	return nil, ErrKeyType
}

// Verify reports whether sig is a valid signature of subject by pub under
// alg, as the worker makes them (Ed25519 over the subject bytes; ECDSA
// P-256 over the subject as the SHA-256 digest, ASN.1 DER).
func Verify(alg signing.SignatureAlgorithm, pub crypto.PublicKey, subject, sig []byte) bool {
	switch alg {
	case signing.Ed25519:
		p, ok := pub.(ed25519.PublicKey)
		return ok && len(p) == ed25519.PublicKeySize && ed25519.Verify(p, subject, sig)
	case signing.EcdsaP256Sha256:
		p, ok := pub.(*ecdsa.PublicKey)
		return ok && p.Curve == elliptic.P256() && ecdsa.VerifyASN1(p, subject, sig)
	}
	return false
}

// GenerateKeyFile creates a new key of alg in path (PKCS#8 PEM, mode 0600,
// written to a temporary file and renamed, never over an existing file)
// and returns it as ref.
func GenerateKeyFile(path, ref string, alg signing.SignatureAlgorithm) (Key, error) {
	if !ValidKeyRef(ref) {
		return Key{}, ErrKeyRef
	}
	var priv crypto.Signer
	var err error
	switch alg {
	case signing.Ed25519:
		_, priv, err = ed25519.GenerateKey(rand.Reader)
	case signing.EcdsaP256Sha256:
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	default:
		return Key{}, ErrKeyType
	}
	if err != nil {
		return Key{}, fmt.Errorf("signer: generate key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return Key{}, fmt.Errorf("signer: encode key: %w", err)
	}
	if _, err := os.Lstat(path); err == nil {
		return Key{}, fmt.Errorf("signer: %s exists; not overwriting a key", path)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return Key{}, fmt.Errorf("signer: create key file: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return Key{}, fmt.Errorf("signer: key file mode: %w", err)
	}
	if err := pem.Encode(tmp, &pem.Block{Type: "PRIVATE KEY", Bytes: der}); err != nil {
		tmp.Close()
		return Key{}, fmt.Errorf("signer: write key file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return Key{}, fmt.Errorf("signer: write key file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return Key{}, fmt.Errorf("signer: write key file: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil { // fails if path appeared meanwhile
		return Key{}, fmt.Errorf("signer: install key file: %w", err)
	}
	return NewKey(ref, priv)
}

// LoadKeyFile reads the key ref from path: a PKCS#8 PEM Ed25519 or ECDSA
// P-256 private key in a file no group or other may access.
func LoadKeyFile(path, ref string) (Key, error) {
	st, err := os.Stat(path)
	if err != nil {
		return Key{}, fmt.Errorf("signer: key %s: %w", ref, err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return Key{}, fmt.Errorf("%w: %s is %v", ErrKeyFileMode, path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Key{}, fmt.Errorf("signer: key %s: %w", ref, err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return Key{}, fmt.Errorf("signer: %s holds no PKCS#8 PEM private key", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return Key{}, fmt.Errorf("signer: %s: %w", path, err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return Key{}, ErrKeyType
	}
	return NewKey(ref, s)
}

// PublicKeyPEM returns the key's public key as a PKIX PEM block, to hand to
// whoever verifies the signatures.
func (k Key) PublicKeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// ParsePublicKeyPEM parses a PKIX PEM public key (PublicKeyPEM's output).
func ParsePublicKeyPEM(b []byte) (crypto.PublicKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PUBLIC KEY" {
		return nil, errors.New("signer: no PEM public key")
	}
	return x509.ParsePKIXPublicKey(blk.Bytes)
}
