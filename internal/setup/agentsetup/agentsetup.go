// Package agentsetup is the agent's assembly from its configuration: the
// credential (client TLS, signing key, RunnerId), one backend dialer per
// endpoint URI with its fallback class and, for the TCP backends, the HTTP
// CONNECT proxy (backends/yamux/proxy), the [fallback] policy, and the
// development credential. It is the only place that knows which backend
// package dials which URI scheme.
//
// It knows no daemon and no authority (package daemonsetup) and no
// server side (package serversetup): forgeyard-agent links neither the
// engine of the daemon nor a database driver (internal/testkit/deptest checks
// it). It imports backends, so only cmd/ and internal test tooling use
// it; semantics/ never does.
package agentsetup

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/webtransport"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
)

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
		return nil, config.WithTrustKeys(err, config.AgentCredentialKeys)
	}
	if client.CurvePreferences, err = config.ParseCurves("control_plane.curves", cp.Curves); err != nil {
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
	if !cp.DisableSessionResumption {
		// This agent's own session cache (issue 25 item 4), shared by
		// its dialers (they clone Client); trust.Credentials'
		// ClientConfigFor rebinds it to the renewable certificate.
		client.ClientSessionCache = trust.NewSessionCache(func() *x509.Certificate { return leaf })
	}
	return &Credential{Runner: runner, Signer: signer, CertChain: cert.Certificate, Leaf: leaf, Client: client}, nil
}

// Dialer returns the dialer and the address to dial for an endpoint. The
// TLS configuration is cloned; ServerName defaults to the endpoint host.
// A yamux+upgrade endpoint gets the HTTP/1.1 Upgrade form. No proxy: see
// Endpoint for the agent's dialers.
// qcfg tunes QUIC and WebTransport, ycfg yamux.
func Dialer(e config.Endpoint, client *tls.Config, qcfg quic.Config, ycfg yamux.Config) (semantics.BackendDialer, string, error) {
	tc := client.Clone()
	if tc.ServerName == "" {
		tc.ServerName = e.Host()
	}
	switch e.Backend {
	case config.BackendQUIC:
		if qcfg.RefusalBackoff == 0 { // a daemon's pre-handshake refusal paces the dial (issue 14)
			qcfg.RefusalBackoff = quic.DefaultRefusalBackoff
		}
		return quic.Dialer{TLS: tc, Config: qcfg}, e.HostPort, nil
	case config.BackendYamux:
		return yamux.Dialer{TLS: tc, Config: ycfg, Upgrade: e.Upgrade}, e.HostPort, nil
	case config.BackendWebTransport:
		return webtransport.Dialer{TLS: tc, Config: qcfg}, webtransport.URL(e.HostPort), nil
	}
	return nil, "", fmt.Errorf("endpoint %s: unknown backend %q", e, e.Backend)
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
