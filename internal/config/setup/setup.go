// Package setup turns a loaded configuration (package config) into the
// running pieces the commands and the demo need: TLS configurations,
// backend listeners and dialers, the authority, and the agent's signing key
// and certificate chain. It is the only place that knows which backend
// package serves which URI scheme.
//
// It imports backends, so only cmd/ and internal test tooling use it;
// semantics/ never does.
package setup

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/webtransport"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
)

// maxDSNFile bounds a PostgreSQL DSN file.
const maxDSNFile = 64 << 10

// ServerTLS builds the daemon's mTLS server configuration (client
// certificates required and verified against tls.client_ca).
func ServerTLS(c config.ServerTLS) (*tls.Config, error) {
	return trust.ServerConfig(trust.ServerFiles{
		CertFile: c.Certificate, KeyFile: c.PrivateKey, ClientCAFile: c.ClientCA, RequireClientCert: true,
	})
}

// RunnerCAs reads the runner CA file into a pool (for certificate chains
// agents send in RegisterAgentV1 through a relay).
func RunnerCAs(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tls.client_ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("tls.client_ca %q: no PEM certificate", path)
	}
	return pool, nil
}

// Listener is one backend listener.
type Listener struct {
	Backend string // config.BackendQUIC, ...
	semantics.BackendListener
}

// Listen opens a listener for every configured backend. On error, the
// listeners already opened are closed. qcfg tunes QUIC and WebTransport;
// ycfg tunes yamux (zero values are the backend defaults).
func Listen(l config.Listen, tlsConf *tls.Config, qcfg quic.Config, ycfg yamux.Config) ([]Listener, error) {
	var out []Listener
	fail := func(key string, err error) ([]Listener, error) {
		for _, o := range out {
			o.Close()
		}
		return nil, fmt.Errorf("listen.%s: %w", key, err)
	}
	if l.QUIC != "" {
		ln, err := quic.Listen(l.QUIC, tlsConf, qcfg)
		if err != nil {
			return fail("quic", err)
		}
		out = append(out, Listener{config.BackendQUIC, ln})
	}
	if l.Yamux != "" {
		ln, err := yamux.Listen(l.Yamux, tlsConf, ycfg)
		if err != nil {
			return fail("yamux", err)
		}
		out = append(out, Listener{config.BackendYamux, ln})
	}
	if l.WebTransport != "" {
		ln, err := webtransport.Listen(l.WebTransport, tlsConf, qcfg)
		if err != nil {
			return fail("webtransport", err)
		}
		out = append(out, Listener{config.BackendWebTransport, ln})
	}
	return out, nil
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
		return nil, fmt.Errorf("authority.postgres_dsn_file: %w", err)
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

// Credential is an agent's loaded identity.
type Credential struct {
	Runner    wire.RunnerId
	Signer    crypto.Signer
	CertChain [][]byte // DER, leaf first
	Leaf      *x509.Certificate
	// Client is the TLS client configuration (client certificate, CA,
	// server name) every dialer clones.
	Client *tls.Config
}

// LoadCredential loads the agent credential files: the client TLS
// configuration (trust.ClientConfig checks them), the private key as a
// crypto.Signer for the registration key proof, and the RunnerId bound to
// the certificate.
func LoadCredential(cp config.ControlPlane) (*Credential, error) {
	c := cp.Credential
	client, err := trust.ClientConfig(trust.ClientFiles{CertFile: c.Certificate, KeyFile: c.PrivateKey, CAFile: c.CA, ServerName: cp.ServerName})
	if err != nil {
		return nil, err
	}
	if len(client.Certificates) != 1 {
		return nil, errors.New("control_plane.credential: no client certificate loaded")
	}
	cert := client.Certificates[0]
	signer, ok := cert.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("control_plane.credential.private_key %q: key type %T cannot sign", c.PrivateKey, cert.PrivateKey)
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("control_plane.credential.certificate: %w", err)
		}
	}
	runner, err := trust.RunnerIDFromCert(leaf)
	if err != nil {
		return nil, fmt.Errorf("control_plane.credential.certificate %q: %w", c.Certificate, err)
	}
	return &Credential{Runner: runner, Signer: signer, CertChain: cert.Certificate, Leaf: leaf, Client: client}, nil
}

// Dialer returns the dialer and the address to dial for an endpoint. The
// TLS configuration is cloned; ServerName defaults to the endpoint host.
// A yamux+upgrade endpoint gets the HTTP/1.1 Upgrade form. No proxy: see
// relay/fallback for the agent's dialers.
// qcfg tunes QUIC and WebTransport, ycfg yamux.
func Dialer(e config.Endpoint, client *tls.Config, qcfg quic.Config, ycfg yamux.Config) (semantics.BackendDialer, string, error) {
	tc := client.Clone()
	if tc.ServerName == "" {
		tc.ServerName = e.Host()
	}
	switch e.Backend {
	case config.BackendQUIC:
		return quic.Dialer{TLS: tc, Config: qcfg}, e.HostPort, nil
	case config.BackendYamux:
		return yamux.Dialer{TLS: tc, Config: ycfg, Upgrade: e.Upgrade}, e.HostPort, nil
	case config.BackendWebTransport:
		return webtransport.Dialer{TLS: tc, Config: qcfg}, webtransport.URL(e.HostPort), nil
	}
	return nil, "", fmt.Errorf("endpoint %s: unknown backend %q", e, e.Backend)
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

// DevAgent fills the credential paths of cp with agent name of the
// development PKI in dir, creating the agent (and the PKI) when needed.
func DevAgent(dir, name string, cp *config.ControlPlane) (*trust.DevPKI, error) {
	pki, err := trust.GenerateDevPKI(dir, trust.DevPKIOptions{Agents: []string{name}})
	if err != nil {
		return nil, err
	}
	a, ok := pki.Agent(name)
	if !ok {
		return nil, fmt.Errorf("dev PKI %s has no agent %q", dir, name)
	}
	cp.Credential = config.Credential{Certificate: a.CertFile, PrivateKey: a.KeyFile, CA: pki.CA.CertFile}
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
		return ic, fmt.Errorf("enrollment: %w", err)
	}
	ic.Issuer = is
	tlsConf.ClientAuth = tls.VerifyClientCertIfGiven
	return ic, nil
}
