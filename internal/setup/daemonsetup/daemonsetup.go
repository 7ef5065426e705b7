// Package daemonsetup is the daemon's own assembly from its configuration:
// the authority store (SQLite or PostgreSQL), the runner CA pool, the
// enrollment identity, and the development PKI (Build); then the steps
// that start it after Build, in order: Instrument, Listen, StartAdmin,
// Serving.Accept and Serving.Wait (serve.go, admin.go). What the daemon shares
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
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

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
	return openPostgresWaiting(ctx, a.PostgresDSNFile, strings.TrimSpace(dsn), nil)
}

// OpenAuthorityWaiting is OpenAuthority for a daemon's start: a PostgreSQL
// authority that cannot be reached yet (stopped, starting up, its network
// not up) is waited for — each failed attempt logged at WARN with the
// configuration key, retried with exponential backoff and full jitter
// (WaitBase doubling up to WaitMax) — until ctx ends (SIGTERM). Errors
// that waiting does not fix (an unreadable DSN file, a refused password,
// a bad database name, SQLite) are returned at once.
func OpenAuthorityWaiting(ctx context.Context, a config.AuthorityConfig, log *slog.Logger) (authority.Authority, error) {
	if a.SQLite != "" {
		return OpenAuthority(ctx, a)
	}
	dsn, err := readSmallFile(a.PostgresDSNFile, maxDSNFile)
	if err != nil {
		return nil, config.Invalid(fmt.Errorf("authority.postgres_dsn_file: %w", err))
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return openPostgresWaiting(ctx, a.PostgresDSNFile, strings.TrimSpace(dsn), log)
}

// Waiting for the authority at start.
const (
	WaitBase    = 500 * time.Millisecond
	WaitMax     = 10 * time.Second
	waitAttempt = 10 * time.Second // one connection attempt
)

// openPostgresWaiting opens the PostgreSQL authority; with log set it
// waits out errors waitFixes says time may fix.
func openPostgresWaiting(ctx context.Context, dsnFile, dsn string, log *slog.Logger) (authority.Authority, error) {
	for wait, attempt := WaitBase, 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, waitAttempt)
		au, err := authority.OpenPostgres(actx, dsn)
		cancel()
		if err == nil {
			if attempt > 1 {
				log.Info("the PostgreSQL authority is reachable", "attempts", attempt)
			}
			return au, nil
		}
		// The DSN may carry a password: never echo it.
		rerr := fmt.Errorf("authority.postgres_dsn_file %q: cannot open PostgreSQL: %w", dsnFile, redactDSN(err, dsn))
		if log == nil || ctx.Err() != nil || !waitFixes(err) {
			return nil, rerr
		}
		d := time.Duration(rand.Int64N(int64(wait))) + wait/2
		log.Warn("waiting for the PostgreSQL authority", "err", rerr, "attempt", attempt, "retry_in", d.Round(10*time.Millisecond),
			"key", "authority.postgres_dsn_file")
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, rerr
		case <-t.C:
		}
		wait = min(2*wait, WaitMax)
	}
}

// waitFixes reports whether opening the authority failed in a way that
// waiting may fix: no connection (refused, unreachable, timed out) or a
// server that is starting up or shutting down (SQLSTATE 57P01–57P03).
func waitFixes(err error) bool {
	var ne net.Error
	switch {
	case errors.As(err, &ne), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH), errors.Is(err, context.DeadlineExceeded):
		return true
	}
	msg := err.Error()
	for _, s := range []string{"57P01", "57P02", "57P03", "the database system is starting up", "the database system is shutting down", "connection refused"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
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
