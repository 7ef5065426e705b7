package trust

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base32"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"strings"
	"time"

	"forgeyard.dev/transport/wire"
)

// Enrollment (§20) and rotation (§21) building blocks. The agent generates
// its own key (GenerateKey) and sends only a certificate signing request
// (CreateCSR); the daemon checks it (ParseCSR) and an Issuer signs a
// certificate bound to a RunnerId. Bootstrap tokens (NewEnrollmentToken)
// are random 256-bit secrets of which the authority stores only the hash
// (HashEnrollmentToken).

// Enrollment limits and defaults.
const (
	// MaxCSRSize bounds a DER certificate signing request.
	MaxCSRSize = 4096
	// EnrollmentTokenPrefix starts every bootstrap token, so that a leaked
	// token is recognisable by secret scanners.
	EnrollmentTokenPrefix = "fyet_"
	// enrollmentTokenBytes is the token's entropy: 256 bits (≥128 required).
	enrollmentTokenBytes = 32
	// EnrollmentTokenLen is the length of a token string.
	EnrollmentTokenLen = len(EnrollmentTokenPrefix) + 52 // base32 of 32 bytes, unpadded
	// DefaultIssuedValidity is the lifetime of certificates an Issuer signs
	// when Issuer.Validity is zero.
	DefaultIssuedValidity = 30 * 24 * time.Hour
	// DefaultTokenTTL is how long a bootstrap token stays usable when the
	// operator gives no TTL.
	DefaultTokenTTL = 24 * time.Hour
)

// Enrollment errors. The daemon answers them to the agent with a
// WireErrorV1 whose message is the error text; compare with errors.Is.
var (
	// ErrBadCSR: the request is not a well-formed, correctly self-signed
	// PKCS#10 request.
	ErrBadCSR = errors.New("trust: invalid certificate signing request")
	// ErrCSRKeyType: the request's key is not ECDSA P-256/P-384 or Ed25519.
	ErrCSRKeyType = errors.New("trust: certificate signing request key must be ECDSA P-256/P-384 or Ed25519")
	// ErrBadEnrollmentToken: the string is not a token this package made
	// (wrong prefix, length or alphabet). It never reaches the authority.
	ErrBadEnrollmentToken = errors.New("trust: malformed enrollment token (expected fyet_ followed by 52 base32 characters)")
	// ErrIssuerNotCA: the configured issuing certificate cannot sign
	// client certificates.
	ErrIssuerNotCA = errors.New("trust: issuing certificate is not a usable CA")
)

var tokenEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// NewEnrollmentToken returns a fresh bootstrap token: "fyet_" followed by
// 256 random bits in unpadded base32. Show it to the operator once; store
// only HashEnrollmentToken of it.
func NewEnrollmentToken() (string, error) {
	var b [enrollmentTokenBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("trust: generate enrollment token: %w", err)
	}
	return EnrollmentTokenPrefix + tokenEncoding.EncodeToString(b[:]), nil
}

// CheckEnrollmentToken returns ErrBadEnrollmentToken unless tok has the
// shape NewEnrollmentToken produces. It does not say whether the token is
// known; only the authority can.
func CheckEnrollmentToken(tok string) error {
	if len(tok) != EnrollmentTokenLen || !strings.HasPrefix(tok, EnrollmentTokenPrefix) {
		return ErrBadEnrollmentToken
	}
	if _, err := tokenEncoding.DecodeString(tok[len(EnrollmentTokenPrefix):]); err != nil {
		return ErrBadEnrollmentToken
	}
	return nil
}

// HashEnrollmentToken returns the SHA-256 of tok, the only form in which
// the authority stores it. The token has 256 bits of entropy, so a plain
// hash is not brute-forceable.
func HashEnrollmentToken(tok string) [32]byte {
	return sha256.Sum256([]byte("forgeyard/enrollment-token\x00" + tok))
}

// EnrollmentTokenID returns a short public identifier of tok (the first 8
// base32 characters of its hash) for listings, logs and `token revoke`. It
// reveals nothing usable about the token.
func EnrollmentTokenID(tok string) string {
	h := HashEnrollmentToken(tok)
	return strings.ToLower(tokenEncoding.EncodeToString(h[:])[:12])
}

// GenerateKey returns a new ECDSA P-256 private key for an agent. The key
// never leaves the agent: only CreateCSR's request does.
func GenerateKey() (crypto.Signer, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("trust: generate key: %w", err)
	}
	return k, nil
}

// CreateCSR returns a DER PKCS#10 request for key's public key with the
// subject common name cn. It contains the public key and a signature made
// with key, never the private key itself.
func CreateCSR(key crypto.Signer, cn string) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn}}, key)
	if err != nil {
		return nil, fmt.Errorf("trust: create certificate signing request: %w", err)
	}
	return der, nil
}

// ParseCSR parses and checks a DER request: at most MaxCSRSize bytes, a
// valid self-signature (proof of possession of the key) and an ECDSA
// P-256/P-384 or Ed25519 key. Errors wrap ErrBadCSR or ErrCSRKeyType.
// Everything else in the request (subject, SANs, extensions) is ignored:
// the Issuer decides the certificate's contents.
func ParseCSR(der []byte) (*x509.CertificateRequest, error) {
	if len(der) == 0 || len(der) > MaxCSRSize {
		return nil, fmt.Errorf("%w: %d bytes (1..%d allowed)", ErrBadCSR, len(der), MaxCSRSize)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadCSR, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: signature does not verify: %v", ErrBadCSR, err)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return nil, fmt.Errorf("%w (got ECDSA %s)", ErrCSRKeyType, k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
	default:
		return nil, fmt.Errorf("%w (got %T)", ErrCSRKeyType, csr.PublicKey)
	}
	return csr, nil
}

// Issuer signs agent certificates with a runner CA (the daemon's issuing
// CA certificate and key). Safe for concurrent use once configured.
type Issuer struct {
	// CA is the issuing certificate; it must be a CA allowed to sign
	// certificates. Chain holds its intermediates up to (excluding) the
	// root, if CA is itself an intermediate; they are appended to issued
	// chains.
	CA    *x509.Certificate
	Chain []*x509.Certificate
	// Key is CA's private key.
	Key crypto.Signer
	// Validity is the lifetime of issued certificates; zero means
	// DefaultIssuedValidity. It is clipped to the CA's own NotAfter.
	Validity time.Duration
	// Now overrides the clock; nil means time.Now.
	Now func() time.Time
}

// LoadIssuer reads an issuing CA certificate (optionally followed by its
// intermediates) and its key from PEM files, such as the development
// PKI's ca.pem and ca-key.pem. Errors are *FileError values, or wrap
// ErrIssuerNotCA.
func LoadIssuer(certFile, keyFile string, validity time.Duration) (*Issuer, error) {
	certPEM, err := readFile("IssuerCertFile", certFile)
	if err != nil {
		return nil, err
	}
	keyPEM, err := readFile("IssuerKeyFile", keyFile)
	if err != nil {
		return nil, err
	}
	certs, err := parseCertsPEM("IssuerCertFile", certFile, certPEM)
	if err != nil {
		return nil, err
	}
	key, err := parseKeyPEM("IssuerKeyFile", keyFile, keyPEM)
	if err != nil {
		return nil, err
	}
	if !publicKeysEqual(key.Public(), certs[0].PublicKey) {
		return nil, &FileError{Field: "IssuerKeyFile", Path: keyFile, Kind: ErrKeyMismatch}
	}
	if err := checkValidity("IssuerCertFile", certFile, certs[0], "issuing CA certificate", time.Now()); err != nil {
		return nil, err
	}
	is := &Issuer{CA: certs[0], Chain: certs[1:], Key: key, Validity: validity}
	if err := is.check(); err != nil {
		return nil, err
	}
	return is, nil
}

func (is *Issuer) check() error {
	if is == nil || is.CA == nil || is.Key == nil {
		return fmt.Errorf("%w: no issuing certificate or key configured", ErrIssuerNotCA)
	}
	if !is.CA.IsCA || !is.CA.BasicConstraintsValid {
		return fmt.Errorf("%w: %q is not a CA certificate", ErrIssuerNotCA, is.CA.Subject.String())
	}
	if is.CA.KeyUsage != 0 && is.CA.KeyUsage&x509.KeyUsageCertSign == 0 {
		return fmt.Errorf("%w: %q lacks the certSign key usage", ErrIssuerNotCA, is.CA.Subject.String())
	}
	return nil
}

// Issue signs a client certificate for csr's key bound to runner through
// the URI SAN forgeyard://runner/<runner> (and nothing else: the CSR's
// subject and extensions are ignored; the common name is cn). It returns
// the chain to send to the agent (leaf first, then Chain) and the parsed
// leaf. The leaf is valid from 5 minutes ago (clock skew) for Validity,
// clipped to the CA's NotAfter; its serial number is 127 random bits.
func (is *Issuer) Issue(csr *x509.CertificateRequest, runner wire.RunnerId, cn string) ([][]byte, *x509.Certificate, error) {
	if err := is.check(); err != nil {
		return nil, nil, err
	}
	if csr == nil {
		return nil, nil, fmt.Errorf("%w: no request", ErrBadCSR)
	}
	if runner == (wire.RunnerId{}) {
		return nil, nil, errors.New("trust: Issue: zero RunnerId")
	}
	now := time.Now()
	if is.Now != nil {
		now = is.Now()
	}
	validity := is.Validity
	if validity <= 0 {
		validity = DefaultIssuedValidity
	}
	notAfter := now.Add(validity)
	if notAfter.After(is.CA.NotAfter) {
		notAfter = is.CA.NotAfter
	}
	if !notAfter.After(now) {
		return nil, nil, fmt.Errorf("%w: %q expired at %s", ErrIssuerNotCA, is.CA.Subject.String(), is.CA.NotAfter.UTC().Format(time.RFC3339))
	}
	sn, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, fmt.Errorf("trust: serial number: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn.Add(sn, big.NewInt(1)),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    now.Add(-DevBackdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{RunnerURI(runner)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, is.CA, csr.PublicKey, is.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("trust: sign certificate for runner %s: %w", runner, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("trust: parse issued certificate: %w", err)
	}
	chain := [][]byte{der}
	for _, c := range is.Chain {
		chain = append(chain, c.Raw)
	}
	return chain, leaf, nil
}

// SerialString renders a certificate serial number the way the authority
// stores and operators type it: lower-case hex without separators.
func SerialString(c *x509.Certificate) string {
	if c == nil || c.SerialNumber == nil {
		return ""
	}
	return c.SerialNumber.Text(16)
}

// RenewAt returns when an agent should renew a certificate: at two thirds
// of its lifetime, or window before expiry if that is earlier but still in
// the second half of the lifetime (a window longer than half the lifetime
// is ignored, so a short-lived certificate is not renewed the moment it
// arrives). A zero window means DefaultExpiryWarningWindow.
func RenewAt(c *x509.Certificate, window time.Duration) time.Time {
	if window <= 0 {
		window = DefaultExpiryWarningWindow
	}
	life := c.NotAfter.Sub(c.NotBefore)
	at := c.NotBefore.Add(life * 2 / 3)
	if w := c.NotAfter.Add(-window); w.Before(at) && !w.Before(c.NotBefore.Add(life/2)) {
		at = w
	}
	return at
}
