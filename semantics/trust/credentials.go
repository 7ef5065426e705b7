package trust

import (
	"bytes"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"forgeyard.dev/transport/semantics/internal/atomicfile"

	"forgeyard.dev/transport/wire"
)

// Credentials is a certificate and key that can change while listeners and
// dialers keep running (rotation, §21): TLS configurations built with
// ClientConfigFor / ServerConfigFor ask it for the current certificate at
// every handshake (GetClientCertificate / GetCertificate), so a renewed
// certificate is used by the next connection without restarting anything.
// Safe for concurrent use.
type Credentials struct {
	certFile, keyFile string
	usage             x509.ExtKeyUsage

	updMu sync.Mutex // serializes Update (file writes)
	mu    sync.RWMutex
	cert  *tls.Certificate
}

// NewCredentials wraps an in-memory certificate (cert.Leaf must be set or
// parseable from cert.Certificate[0]). Update then only swaps it in memory.
func NewCredentials(cert tls.Certificate) (*Credentials, error) {
	if len(cert.Certificate) == 0 || cert.PrivateKey == nil {
		return nil, errors.New("trust: NewCredentials: empty certificate or key")
	}
	if cert.Leaf == nil {
		leaf, err := x509.ParseCertificate(cert.Certificate[0])
		if err != nil {
			return nil, fmt.Errorf("trust: NewCredentials: %w", err)
		}
		cert.Leaf = leaf
	}
	return &Credentials{usage: x509.ExtKeyUsageClientAuth, cert: &cert}, nil
}

// LoadCredentials loads an agent's (client) certificate and key from PEM
// files, checked as ClientConfig checks them. Update writes renewed
// credentials back to the same files.
//
// If a previous Update was interrupted after replacing the key but before
// replacing the certificate, the new certificate waits in certFile+".next";
// LoadCredentials finishes that rename when the key matches it.
func LoadCredentials(certFile, keyFile string) (*Credentials, error) {
	return loadCredentials(certFile, keyFile, x509.ExtKeyUsageClientAuth)
}

// LoadServerCredentials is LoadCredentials for a server certificate (a
// daemon's or relay's), for ServerConfigFor; Reload picks up replaced
// files.
func LoadServerCredentials(certFile, keyFile string) (*Credentials, error) {
	return loadCredentials(certFile, keyFile, x509.ExtKeyUsageServerAuth)
}

func loadCredentials(certFile, keyFile string, usage x509.ExtKeyUsage) (*Credentials, error) {
	c := &Credentials{certFile: certFile, keyFile: keyFile, usage: usage}
	if err := c.Reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// Reload re-reads the files (for credentials loaded from files). On error
// the current certificate is kept.
func (c *Credentials) Reload() error {
	if c.certFile == "" {
		return nil
	}
	cert, err := loadKeyPair("CertFile", c.certFile, "KeyFile", c.keyFile, c.usage, time.Now())
	if err != nil && errors.Is(err, ErrKeyMismatch) {
		// An interrupted Update: the key is new, the certificate waits.
		next := c.certFile + ".next"
		if cert2, err2 := loadKeyPair("CertFile", next, "KeyFile", c.keyFile, c.usage, time.Now()); err2 == nil {
			if rerr := os.Rename(next, c.certFile); rerr == nil {
				_ = atomicfile.SyncDir(filepath.Dir(c.certFile))
				cert, err = cert2, nil
			}
		}
	}
	if err != nil {
		return err
	}
	if c.usage == x509.ExtKeyUsageClientAuth {
		if _, err := RunnerIDFromCert(cert.Leaf); err != nil && !errors.Is(err, ErrNoRunnerURI) {
			return &FileError{Field: "CertFile", Path: c.certFile, Kind: ErrWrongKeyUsage, Cause: err}
		}
	}
	c.mu.Lock()
	c.cert = &cert
	c.mu.Unlock()
	return nil
}

// Certificate returns the current certificate (never nil once created).
// The caller must not modify it.
func (c *Credentials) Certificate() *tls.Certificate {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.cert
}

// Leaf returns the current leaf certificate.
func (c *Credentials) Leaf() *x509.Certificate { return c.Certificate().Leaf }

// Signer returns the current private key.
func (c *Credentials) Signer() crypto.Signer {
	s, _ := c.Certificate().PrivateKey.(crypto.Signer)
	return s
}

// Chain returns the current DER chain, leaf first (a copy of the slice).
func (c *Credentials) Chain() [][]byte {
	return append([][]byte(nil), c.Certificate().Certificate...)
}

// Runner returns the RunnerId of the current leaf.
func (c *Credentials) Runner() (wire.RunnerId, error) { return RunnerIDFromCert(c.Leaf()) }

// GetClientCertificate implements tls.Config.GetClientCertificate.
func (c *Credentials) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return c.Certificate(), nil
}

// GetCertificate implements tls.Config.GetCertificate.
func (c *Credentials) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return c.Certificate(), nil
}

// ClientConfigFor returns a clone of base (from ClientConfig; its
// Certificates are dropped) that presents c's current certificate at each
// handshake. When base has a ClientSessionCache (session resumption
// wanted), the clone gets its own NewSessionCache bound to c's current
// certificate instead, so a renewal empties it.
func (c *Credentials) ClientConfigFor(base *tls.Config) *tls.Config {
	cfg := base.Clone()
	cfg.Certificates = nil
	cfg.GetClientCertificate = c.GetClientCertificate
	if base.ClientSessionCache != nil {
		cfg.ClientSessionCache = NewSessionCache(c.Leaf)
	}
	return cfg
}

// ServerConfigFor returns a clone of base (from ServerConfig; its
// Certificates are dropped) that serves c's current certificate at each
// handshake.
func (c *Credentials) ServerConfigFor(base *tls.Config) *tls.Config {
	cfg := base.Clone()
	cfg.Certificates = nil
	cfg.GetCertificate = c.GetCertificate
	return cfg
}

// Update replaces the credentials with a renewed chain (DER, leaf first)
// and its key. The leaf must match key, be currently valid and name the
// same RunnerId as the current leaf (rotation never changes the runner,
// §21). For file-backed credentials the files are replaced first, each
// through a temporary file and a rename, in an order that LoadCredentials
// can complete after a crash (certificate to certFile.next, key, then
// certificate); only then is the in-memory certificate swapped.
func (c *Credentials) Update(chain [][]byte, key crypto.Signer) error {
	if len(chain) == 0 || key == nil {
		return errors.New("trust: Update: empty chain or key")
	}
	c.updMu.Lock()
	defer c.updMu.Unlock()
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return fmt.Errorf("trust: Update: renewed certificate: %w", err)
	}
	if !publicKeysEqual(key.Public(), leaf.PublicKey) {
		return fmt.Errorf("trust: Update: %w", ErrKeyMismatch)
	}
	if err := checkValidity("CertFile", c.certFile, leaf, "renewed certificate", time.Now()); err != nil {
		return err
	}
	newID, err := RunnerIDFromCert(leaf)
	if err != nil {
		return fmt.Errorf("trust: Update: renewed certificate: %w", err)
	}
	if oldID, err := c.Runner(); err == nil && oldID != newID {
		return fmt.Errorf("trust: Update: renewed certificate names runner %s, not %s", newID, oldID)
	}
	if c.certFile != "" {
		if err := writeCredentialFiles(c.certFile, c.keyFile, chain, key); err != nil {
			return err
		}
	}
	cert := &tls.Certificate{Certificate: append([][]byte(nil), chain...), PrivateKey: key, Leaf: leaf}
	c.mu.Lock()
	c.cert = cert
	c.mu.Unlock()
	return nil
}

// WriteCredentialFiles writes a certificate chain (DER, leaf first) and its
// key as PEM files (key 0600, certificate 0644), each atomically through a
// temporary file and a rename, in the crash-safe order LoadCredentials
// understands. The directory must exist.
func WriteCredentialFiles(certFile, keyFile string, chain [][]byte, key crypto.Signer) error {
	return writeCredentialFiles(certFile, keyFile, chain, key)
}

func writeCredentialFiles(certFile, keyFile string, chain [][]byte, key crypto.Signer) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("trust: encode key: %w", err)
	}
	var certPEM []byte
	for _, c := range chain {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c})...)
	}
	next := certFile + ".next"
	if err := writeAtomic(next, certPEM, 0o644); err != nil {
		return err
	}
	if err := writeAtomic(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		_ = os.Remove(next)
		return err
	}
	if err := os.Rename(next, certFile); err != nil {
		// A concurrent Reload that saw the new key before the new
		// certificate finishes an "interrupted" write by doing this very
		// rename (see Reload); then certFile already holds certPEM.
		if got, rerr := os.ReadFile(certFile); errors.Is(err, os.ErrNotExist) && rerr == nil && bytes.Equal(got, certPEM) {
			return nil
		}
		return fmt.Errorf("trust: write %s: %w", certFile, err)
	}
	if err := atomicfile.SyncDir(filepath.Dir(certFile)); err != nil {
		return fmt.Errorf("trust: write %s: sync directory: %w", certFile, err)
	}
	return nil
}
