// Package daemonsetup is the daemon's own assembly from its configuration:
// the authority store (SQLite or PostgreSQL), the runner CA pool, the
// enrollment identity, and the development PKI. What the daemon shares
// with the relay (server TLS, certificate reloader, handshake failures,
// listeners) is package serversetup. Only the daemon (and the operator
// CLI's offline runner commands, the demo and tests) import it: it links
// the authority's database drivers and semantics/daemon.
package daemonsetup

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust"
)

// maxDSNFile bounds a PostgreSQL DSN file.
const maxDSNFile = 64 << 10

// RunnerCAs reads the runner CA file into a pool (for certificate chains
// agents send in RegisterAgentV1 through a relay).
func RunnerCAs(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, config.Invalid(fmt.Errorf("tls.client_ca: %w", err))
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, config.Invalid(fmt.Errorf("tls.client_ca %q: no PEM certificate", path))
	}
	return pool, nil
}

// OpenAuthority opens the configured authority store.
func OpenAuthority(ctx context.Context, a config.AuthorityConfig) (authority.Authority, error) {
	if a.SQLite != "" {
		au, err := authority.OpenSQLite(ctx, a.SQLite)
		if err != nil {
			return nil, fmt.Errorf("authority.sqlite: %w", err)
		}
		return au, nil
	}
	dsn, err := readSmallFile(a.PostgresDSNFile, maxDSNFile)
	if err != nil {
		return nil, config.Invalid(fmt.Errorf("authority.postgres_dsn_file: %w", err))
	}
	au, err := authority.OpenPostgres(ctx, strings.TrimSpace(dsn))
	if err != nil {
		// The DSN may carry a password: never echo it.
		return nil, fmt.Errorf("authority.postgres_dsn_file %q: cannot open PostgreSQL: %w", a.PostgresDSNFile, redactDSN(err, dsn))
	}
	return au, nil
}

func readSmallFile(path string, max int64) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	if st.Size() > max {
		return "", fmt.Errorf("%s: larger than %d bytes", path, max)
	}
	b := make([]byte, st.Size())
	n, err := f.Read(b)
	if err != nil && n == 0 && st.Size() > 0 {
		return "", err
	}
	return string(b[:n]), nil
}

func redactDSN(err error, dsn string) error {
	dsn = strings.TrimSpace(dsn)
	if dsn != "" && strings.Contains(err.Error(), dsn) {
		return errors.New(strings.ReplaceAll(err.Error(), dsn, "<dsn redacted>"))
	}
	return err
}

// DevDaemon fills the TLS paths of d from a development PKI in dir,
// creating it when needed (trust.GenerateDevPKI). It is for development
// and demos only.
func DevDaemon(dir string, tlsConf *config.ServerTLS) (*trust.DevPKI, error) {
	pki, err := trust.GenerateDevPKI(dir, trust.DevPKIOptions{})
	if err != nil {
		return nil, err
	}
	tlsConf.Certificate, tlsConf.PrivateKey, tlsConf.ClientCA = pki.Server.CertFile, pki.Server.KeyFile, pki.CA.CertFile
	return pki, nil
}

// Identity builds the daemon's identity configuration from [enrollment]:
// with an issuing CA, it loads the issuer and relaxes the listeners'
// client authentication to tls.VerifyClientCertIfGiven (a connection
// without a certificate can only enroll; the daemon refuses everything
// else on it), so tlsConf is modified in place.
func Identity(e config.Enrollment, tlsConf *tls.Config) (daemon.IdentityConfig, error) {
	ic := daemon.IdentityConfig{RevocationPoll: e.RevocationPoll.Duration}
	if e.IssuerCertificate == "" {
		return ic, nil
	}
	is, err := trust.LoadIssuer(e.IssuerCertificate, e.IssuerPrivateKey, e.CertificateValidity.Duration)
	if err != nil {
		return ic, config.WithTrustKeys(err, config.EnrollmentKeys)
	}
	ic.Issuer = is
	tlsConf.ClientAuth = tls.VerifyClientCertIfGiven
	return ic, nil
}
