package trust

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"os"
	"time"
)

// maxPEMFileSize bounds every credential file read here. Real certificate
// chains and keys are a few KiB; a larger file is a mistake (wrong path).
const maxPEMFileSize = 1 << 20

// ServerFiles names the PEM files of a daemon (or relay) TLS endpoint.
type ServerFiles struct {
	// CertFile holds the server certificate, optionally followed by
	// intermediates, leaf first. Required.
	CertFile string
	// KeyFile holds the server's private key (PKCS#8, SEC 1 "EC PRIVATE
	// KEY" or PKCS#1). Required; unencrypted.
	KeyFile string
	// ClientCAFile holds the CA certificates that sign agent certificates.
	// Required when RequireClientCert is set; if set without it, a client
	// certificate is verified when offered.
	ClientCAFile string
	// RequireClientCert makes the server demand a client certificate that
	// chains to ClientCAFile (mTLS, §16–17).
	RequireClientCert bool
}

// ClientFiles names the PEM files of an agent (or any client).
type ClientFiles struct {
	// CertFile and KeyFile hold the client certificate (leaf first) and
	// its key. Both or neither: with neither the client presents no
	// certificate (enrollment, §20).
	CertFile string
	KeyFile  string
	// CAFile holds the trust roots for the server certificate. If empty,
	// the system roots are used. Verification is never skipped (§19).
	CAFile string
	// ServerName is the name checked against the server certificate and
	// sent in SNI. If empty, crypto/tls derives it from the dial address.
	ServerName string
}

// ServerConfig builds a TLS 1.3-only server configuration from files.
// Client authentication is tls.RequireAndVerifyClientCert when
// RequireClientCert is set, tls.VerifyClientCertIfGiven when only
// ClientCAFile is set, and tls.NoClientCert otherwise. NextProtos is left
// empty for the backend to fill in.
//
// It fails with a *FileError naming the field, path and problem if a file
// is missing, unreadable or not PEM, if the key does not match the
// certificate, if the certificate is expired or not yet valid, or if it is
// not usable for server authentication. The returned *tls.Config is new and
// owned by the caller; files are read once (reloading for rotation is the
// caller's job).
func ServerConfig(f ServerFiles) (*tls.Config, error) {
	now := time.Now()
	cert, err := loadKeyPair("CertFile", f.CertFile, "KeyFile", f.KeyFile, x509.ExtKeyUsageServerAuth, now)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.NoClientCert,
	}
	switch {
	case f.ClientCAFile != "":
		pool, err := loadCAPool("ClientCAFile", f.ClientCAFile, now)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
		if f.RequireClientCert {
			cfg.ClientAuth = tls.RequireAndVerifyClientCert
		}
	case f.RequireClientCert:
		return nil, &FileError{Field: "ClientCAFile", Kind: ErrFileNotConfigured,
			Cause: errors.New("RequireClientCert needs the CA that signs agent certificates")}
	}
	return cfg, nil
}

// ClientConfig builds a TLS 1.3-only client configuration from files. It
// never sets InsecureSkipVerify. Errors are *FileError values as for
// ServerConfig; a client certificate must also be usable for client
// authentication and, if it carries a forgeyard://runner/ URI SAN, that
// SAN must be well-formed (see RunnerIDFromCert).
func ClientConfig(f ClientFiles) (*tls.Config, error) {
	now := time.Now()
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, ServerName: f.ServerName}
	switch {
	case f.CertFile == "" && f.KeyFile == "":
	case f.CertFile == "":
		return nil, &FileError{Field: "CertFile", Kind: ErrFileNotConfigured, Cause: errors.New("KeyFile is set without CertFile")}
	case f.KeyFile == "":
		return nil, &FileError{Field: "KeyFile", Kind: ErrFileNotConfigured, Cause: errors.New("CertFile is set without KeyFile")}
	default:
		cert, err := loadKeyPair("CertFile", f.CertFile, "KeyFile", f.KeyFile, x509.ExtKeyUsageClientAuth, now)
		if err != nil {
			return nil, err
		}
		if _, err := RunnerIDFromCert(cert.Leaf); err != nil && !errors.Is(err, ErrNoRunnerURI) {
			return nil, &FileError{Field: "CertFile", Path: f.CertFile, Kind: ErrWrongKeyUsage, Cause: err}
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if f.CAFile != "" {
		pool, err := loadCAPool("CAFile", f.CAFile, now)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// readFile reads a bounded credential file, classifying failures.
func readFile(field, path string) ([]byte, error) {
	if path == "" {
		return nil, &FileError{Field: field, Kind: ErrFileNotConfigured}
	}
	fe := func(kind, cause error) error { return &FileError{Field: field, Path: path, Kind: kind, Cause: cause} }
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fe(ErrFileMissing, err)
		}
		return nil, fe(ErrFileUnreadable, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fe(ErrFileUnreadable, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fe(ErrFileUnreadable, fmt.Errorf("not a regular file (%v)", st.Mode().Type()))
	}
	if st.Size() > maxPEMFileSize {
		return nil, fe(ErrFileUnreadable, fmt.Errorf("file is %d bytes, more than the %d-byte limit for a PEM credential", st.Size(), maxPEMFileSize))
	}
	b, err := io.ReadAll(io.LimitReader(f, maxPEMFileSize+1))
	if err != nil {
		return nil, fe(ErrFileUnreadable, err)
	}
	if len(b) > maxPEMFileSize {
		return nil, fe(ErrFileUnreadable, fmt.Errorf("file grew past the %d-byte limit", maxPEMFileSize))
	}
	return b, nil
}

// parseCertsPEM returns every CERTIFICATE block of data, in order.
func parseCertsPEM(field, path string, data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for blk := range pemBlocks(data) {
		if blk.Type != "CERTIFICATE" {
			if isKeyBlock(blk.Type) {
				return nil, &FileError{Field: field, Path: path, Kind: ErrNotPEM,
					Cause: fmt.Errorf("found a %s block: this looks like a key file, not a certificate", blk.Type)}
			}
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, &FileError{Field: field, Path: path, Kind: ErrNotPEM, Cause: fmt.Errorf("certificate %d: %w", len(certs)+1, err)}
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, &FileError{Field: field, Path: path, Kind: ErrNotPEM, Cause: errors.New("no PEM CERTIFICATE block found")}
	}
	return certs, nil
}

// pemBlocks yields the PEM blocks of data in order, as pem.Decode finds
// them one after the other (text between and around blocks is skipped).
func pemBlocks(data []byte) iter.Seq[*pem.Block] {
	return func(yield func(*pem.Block) bool) {
		for rest := data; ; {
			var blk *pem.Block
			if blk, rest = pem.Decode(rest); blk == nil || !yield(blk) {
				return
			}
		}
	}
}

func isKeyBlock(t string) bool {
	switch t {
	case "PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY", "ENCRYPTED PRIVATE KEY":
		return true
	}
	return false
}

// parseKeyPEM returns the first private key in data.
func parseKeyPEM(field, path string, data []byte) (crypto.Signer, error) {
	fe := func(cause error) error { return &FileError{Field: field, Path: path, Kind: ErrNotPEM, Cause: cause} }
	sawCert := false
	for blk := range pemBlocks(data) {
		var key any
		var err error
		switch blk.Type {
		case "PRIVATE KEY":
			key, err = x509.ParsePKCS8PrivateKey(blk.Bytes)
		case "EC PRIVATE KEY":
			key, err = x509.ParseECPrivateKey(blk.Bytes)
		case "RSA PRIVATE KEY":
			key, err = x509.ParsePKCS1PrivateKey(blk.Bytes)
		case "ENCRYPTED PRIVATE KEY":
			return nil, fe(errors.New("encrypted private keys are not supported; store the key unencrypted with mode 0600"))
		case "CERTIFICATE":
			sawCert = true
			continue
		default:
			continue
		}
		if err != nil {
			return nil, fe(fmt.Errorf("%s block: %w", blk.Type, err))
		}
		s, ok := key.(crypto.Signer)
		if !ok {
			return nil, fe(fmt.Errorf("unsupported private key type %T", key))
		}
		return s, nil
	}
	if sawCert {
		return nil, fe(errors.New("found only CERTIFICATE blocks: this looks like a certificate, not a key file"))
	}
	return nil, fe(errors.New("no PEM private key block found"))
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	switch k := a.(type) {
	case *ecdsa.PublicKey:
		return k.Equal(b)
	case *rsa.PublicKey:
		return k.Equal(b)
	case ed25519.PublicKey:
		return k.Equal(b)
	}
	return false
}

// checkValidity reports an expired or not-yet-valid certificate.
func checkValidity(field, path string, c *x509.Certificate, what string, now time.Time) error {
	switch {
	case now.After(c.NotAfter):
		return &FileError{Field: field, Path: path, Kind: ErrCertExpired,
			Cause: fmt.Errorf("%s %q expired at %s (%s ago)", what, c.Subject.String(), c.NotAfter.UTC().Format(time.RFC3339), now.Sub(c.NotAfter).Round(time.Second))}
	case now.Before(c.NotBefore):
		return &FileError{Field: field, Path: path, Kind: ErrCertNotYetValid,
			Cause: fmt.Errorf("%s %q is valid only from %s; check this machine's clock", what, c.Subject.String(), c.NotBefore.UTC().Format(time.RFC3339))}
	}
	return nil
}

func hasExtKeyUsage(c *x509.Certificate, want x509.ExtKeyUsage) bool {
	if len(c.ExtKeyUsage) == 0 && len(c.UnknownExtKeyUsage) == 0 {
		return true // no restriction
	}
	for _, u := range c.ExtKeyUsage {
		if u == want || u == x509.ExtKeyUsageAny {
			return true
		}
	}
	return false
}

// loadKeyPair loads and checks a certificate chain and its key.
func loadKeyPair(certField, certPath, keyField, keyPath string, usage x509.ExtKeyUsage, now time.Time) (tls.Certificate, error) {
	certPEM, err := readFile(certField, certPath)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyPEM, err := readFile(keyField, keyPath)
	if err != nil {
		return tls.Certificate{}, err
	}
	chain, err := parseCertsPEM(certField, certPath, certPEM)
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := parseKeyPEM(keyField, keyPath, keyPEM)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf := chain[0]
	if !publicKeysEqual(key.Public(), leaf.PublicKey) {
		return tls.Certificate{}, &FileError{Field: keyField, Path: keyPath, Kind: ErrKeyMismatch,
			Cause: fmt.Errorf("the key is not the one certified by %s (subject %q)", certPath, leaf.Subject.String())}
	}
	if err := checkValidity(certField, certPath, leaf, "certificate", now); err != nil {
		return tls.Certificate{}, err
	}
	if !hasExtKeyUsage(leaf, usage) {
		role := "server"
		if usage == x509.ExtKeyUsageClientAuth {
			role = "client"
		}
		return tls.Certificate{}, &FileError{Field: certField, Path: certPath, Kind: ErrWrongKeyUsage,
			Cause: fmt.Errorf("certificate %q has no %sAuth extended key usage, so peers will reject it as a %s certificate", leaf.Subject.String(), role, role)}
	}
	out := tls.Certificate{PrivateKey: key, Leaf: leaf}
	for _, c := range chain {
		out.Certificate = append(out.Certificate, c.Raw)
	}
	return out, nil
}

// loadCAPool loads a pool of CA certificates, rejecting expired or non-CA
// entries so that the operator hears about them now rather than as an
// opaque handshake failure later.
func loadCAPool(field, path string, now time.Time) (*x509.CertPool, error) {
	data, err := readFile(field, path)
	if err != nil {
		return nil, err
	}
	certs, err := parseCertsPEM(field, path, data)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		if !c.IsCA || !c.BasicConstraintsValid {
			return nil, &FileError{Field: field, Path: path, Kind: ErrWrongKeyUsage,
				Cause: fmt.Errorf("certificate %q is not a CA certificate (did you configure a leaf certificate as the CA?)", c.Subject.String())}
		}
		if err := checkValidity(field, path, c, "CA certificate", now); err != nil {
			return nil, err
		}
		pool.AddCert(c)
	}
	return pool, nil
}
