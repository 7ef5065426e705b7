// Package trusttest builds throwaway, in-memory PKIs for tests: a fresh
// ECDSA P-256 CA, server certificates for loopback, and agent client
// certificates bound to a RunnerId (forgeyard://runner/<ULID>). Nothing
// touches the disk or the network.
//
// It is importable from tests only by convention: production code must build
// its TLS configuration with package trust from real files. Every function
// reports failures through t.Fatal, so callers need no error handling.
//
// All configurations are TLS 1.3 only and verify the peer; none sets
// InsecureSkipVerify. A *PKI is safe for concurrent use after NewPKI
// returns.
package trusttest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
)

// Validity used by the helpers. Certificates start Backdate before now so a
// peer whose clock lags a little still accepts them.
const (
	CAValidity   = 24 * time.Hour
	LeafValidity = 12 * time.Hour
	Backdate     = 5 * time.Minute
)

// PKI is an in-memory certificate authority. The zero value is not usable;
// create one with NewPKI.
type PKI struct {
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caDER  []byte
	caPEM  []byte
}

// NewPKI returns a fresh CA with an ECDSA P-256 key, valid from a few
// minutes ago for CAValidity. Two PKIs never trust each other.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("trusttest: generate CA key: %v", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: "forgeyard test CA", Organization: []string{"Forgeyard trusttest"}},
		NotBefore:             now.Add(-Backdate),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("trusttest: create CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("trusttest: parse CA certificate: %v", err)
	}
	return &PKI{
		caCert: cert,
		caKey:  key,
		caDER:  der,
		caPEM:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
	}
}

// CAPool returns a new pool holding only this PKI's CA certificate.
func (p *PKI) CAPool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(p.caCert)
	return pool
}

// CACert returns the CA certificate. The caller must not modify it.
func (p *PKI) CACert() *x509.Certificate { return p.caCert }

// CACertPEM returns a fresh copy of the CA certificate in PEM form.
func (p *PKI) CACertPEM() []byte { return append([]byte(nil), p.caPEM...) }

// LeafOptions describes a leaf certificate for IssueServer and IssueClient.
// Zero fields take defaults: NotBefore = now - Backdate, NotAfter = now +
// LeafValidity, CommonName derived from the purpose.
type LeafOptions struct {
	CommonName string
	NotBefore  time.Time
	NotAfter   time.Time
	DNSNames   []string
	IPs        []net.IP
	// URIs are added as URI SANs verbatim. IssueClient adds the runner URI
	// itself unless OmitRunnerURI is set, so use URIs for extra or
	// deliberately malformed entries.
	URIs          []*url.URL
	OmitRunnerURI bool
}

// IssueServer issues a server certificate (ExtKeyUsageServerAuth) for
// serverName plus localhost, 127.0.0.1 and ::1, with opts applied on top
// (extra DNSNames/IPs/URIs are appended).
func (p *PKI) IssueServer(t testing.TB, serverName string, opts LeafOptions) tls.Certificate {
	t.Helper()
	names := []string{"localhost"}
	var ips []net.IP
	if ip := net.ParseIP(serverName); ip != nil {
		ips = append(ips, ip)
	} else if serverName != "" && serverName != "localhost" {
		names = append(names, serverName)
	}
	ips = append(ips, net.IPv4(127, 0, 0, 1), net.IPv6loopback)
	opts.DNSNames = append(names, opts.DNSNames...)
	opts.IPs = append(ips, opts.IPs...)
	if opts.CommonName == "" {
		opts.CommonName = serverName
		if opts.CommonName == "" {
			opts.CommonName = "localhost"
		}
	}
	return p.issue(t, x509.ExtKeyUsageServerAuth, opts)
}

// IssueClient issues an agent client certificate (ExtKeyUsageClientAuth)
// carrying the URI SAN forgeyard://runner/<runner> (unless
// opts.OmitRunnerURI) followed by opts.URIs.
func (p *PKI) IssueClient(t testing.TB, runner wire.RunnerId, opts LeafOptions) tls.Certificate {
	t.Helper()
	if !opts.OmitRunnerURI {
		opts.URIs = append([]*url.URL{trust.RunnerURI(runner)}, opts.URIs...)
	}
	if opts.CommonName == "" {
		opts.CommonName = "runner " + runner.String()
	}
	return p.issue(t, x509.ExtKeyUsageClientAuth, opts)
}

func (p *PKI) issue(t testing.TB, usage x509.ExtKeyUsage, opts LeafOptions) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("trusttest: generate leaf key: %v", err)
	}
	now := time.Now()
	if opts.NotBefore.IsZero() {
		opts.NotBefore = now.Add(-Backdate)
	}
	if opts.NotAfter.IsZero() {
		opts.NotAfter = now.Add(LeafValidity)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: opts.CommonName, Organization: []string{"Forgeyard trusttest"}},
		NotBefore:    opts.NotBefore,
		NotAfter:     opts.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     opts.DNSNames,
		IPAddresses:  opts.IPs,
		URIs:         opts.URIs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatalf("trusttest: create leaf certificate: %v", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("trusttest: parse leaf certificate: %v", err)
	}
	return tls.Certificate{Certificate: [][]byte{der, p.caDER}, PrivateKey: key, Leaf: leaf}
}

// ServerConfig returns a server configuration presenting a certificate for
// serverName, localhost, 127.0.0.1 and ::1, requiring and verifying a client
// certificate signed by this PKI. TLS 1.3 only; NextProtos is left empty
// for the backend to fill in. Each call issues a new certificate and
// returns a new *tls.Config.
func (p *PKI) ServerConfig(t testing.TB, serverName string) *tls.Config {
	t.Helper()
	return p.ServerConfigWith(t, p.IssueServer(t, serverName, LeafOptions{}))
}

// ServerConfigWith is ServerConfig with a caller-supplied certificate (for
// example an expired one from IssueServer).
func (p *PKI) ServerConfigWith(t testing.TB, cert tls.Certificate) *tls.Config {
	t.Helper()
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    p.CAPool(),
	}
}

// ClientConfig returns an agent configuration presenting a fresh client
// certificate bound to runner and trusting only this PKI's CA, with
// ServerName set to serverName. TLS 1.3 only; NextProtos left empty.
func (p *PKI) ClientConfig(t testing.TB, runner wire.RunnerId, serverName string) *tls.Config {
	t.Helper()
	return p.ClientConfigWith(t, p.IssueClient(t, runner, LeafOptions{}), serverName)
}

// ExpiredClientConfig is ClientConfig with a client certificate that expired
// an hour ago (it was valid for the day before). A server built with
// ServerConfig must reject it.
func (p *PKI) ExpiredClientConfig(t testing.TB, runner wire.RunnerId, serverName string) *tls.Config {
	t.Helper()
	now := time.Now()
	cert := p.IssueClient(t, runner, LeafOptions{NotBefore: now.Add(-25 * time.Hour), NotAfter: now.Add(-time.Hour)})
	return p.ClientConfigWith(t, cert, serverName)
}

// NoClientCertConfig returns a client configuration that trusts this PKI's
// CA but presents no client certificate. A server built with ServerConfig
// must reject it.
func (p *PKI) NoClientCertConfig(t testing.TB, serverName string) *tls.Config {
	t.Helper()
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    p.CAPool(),
		ServerName: serverName,
	}
}

// ClientConfigWith returns a client configuration presenting cert, trusting
// only this PKI's CA, with ServerName set to serverName. TLS 1.3 only.
func (p *PKI) ClientConfigWith(t testing.TB, cert tls.Certificate, serverName string) *tls.Config {
	t.Helper()
	c := p.NoClientCertConfig(t, serverName)
	c.Certificates = []tls.Certificate{cert}
	return c
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatalf("trusttest: serial number: %v", err)
	}
	return n.Add(n, big.NewInt(1)) // never zero
}

// Issuer returns a trust.Issuer signing with this PKI's CA, for
// enrollment and rotation tests. validity 0 means trust's default.
func (p *PKI) Issuer(validity time.Duration) *trust.Issuer {
	return &trust.Issuer{CA: p.caCert, Key: p.caKey, Validity: validity}
}

// NotifyingCache is a client session cache that reports every session
// ticket it stores on Stored (without blocking: a full channel drops the
// report), so that a test waits for the ticket a resumption needs instead
// of sleeping.
type NotifyingCache struct {
	tls.ClientSessionCache
	Stored chan struct{}
}

// NewNotifyingCache wraps inner, with room for buf reports.
func NewNotifyingCache(inner tls.ClientSessionCache, buf int) NotifyingCache {
	return NotifyingCache{ClientSessionCache: inner, Stored: make(chan struct{}, buf)}
}

// Put stores cs in the wrapped cache and reports a stored ticket.
func (c NotifyingCache) Put(key string, cs *tls.ClientSessionState) {
	c.ClientSessionCache.Put(key, cs)
	if cs != nil {
		select {
		case c.Stored <- struct{}{}:
		default:
		}
	}
}
