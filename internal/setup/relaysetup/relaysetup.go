// Package relaysetup is the relay's own assembly from its configuration:
// the TLS client configuration towards the daemons, the backend
// configuration of its agent-facing TLS+yamux listener (its bounded
// per-stream window), and the development PKI of both sides. What the relay shares with the daemon (server TLS,
// certificate reloader, listeners) is package serversetup. forgeyard-relay
// links no engine (neither semantics/daemon nor semantics/agent) and no
// database driver (internal/testkit/deptest checks it).
package relaysetup

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"time"

	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics/trust"
)

// Development relay client certificate files (in the dev PKI directory).
const (
	DevRelayCertFile = "relay-client.pem"
	DevRelayKeyFile  = "relay-client-key.pem"
)

// RelayUpstreamTLS builds the relay's TLS client configuration towards the
// daemons from the [upstream] section. The relay's certificate, when
// configured, must not name a runner: the daemon treats a TLS peer that
// names a runner as that runner and would refuse the agents' own
// certificate chains.
func RelayUpstreamTLS(u config.RelayUpstream) (*tls.Config, error) {
	tc, err := trust.ClientConfig(trust.ClientFiles{CertFile: u.Certificate, KeyFile: u.PrivateKey, CAFile: u.CA, ServerName: u.ServerName})
	if err != nil {
		return nil, config.WithTrustKeys(err, config.RelayUpstreamKeys)
	}
	if len(tc.Certificates) == 1 {
		leaf := tc.Certificates[0].Leaf
		if leaf == nil {
			if leaf, err = x509.ParseCertificate(tc.Certificates[0].Certificate[0]); err != nil {
				return nil, fmt.Errorf("upstream.certificate: %w", err)
			}
		}
		if id, err := trust.RunnerIDFromCert(leaf); err == nil {
			return nil, fmt.Errorf("upstream.certificate %q names runner %s; a relay's certificate must not carry a forgeyard://runner/ URI (issue one without it)", u.Certificate, id)
		}
	}
	return tc, nil
}

// AgentYamuxConfig is the configuration of the relay's agent-facing
// TLS+yamux listener (listen.yamux): the per-stream receive window from
// limits.stream_window (r after ApplyDefaults: 2 MiB,
// relay.DefaultAgentStreamWindow, which says why it is below the backend's
// 16 MiB), logging to log.
func AgentYamuxConfig(r *config.Relay, log *slog.Logger) yamux.Config {
	return yamux.Config{Logger: log, MaxStreamWindow: uint32(r.Limits.StreamWindow)}
}

// DevRelay fills the TLS paths of r from a development PKI in dir,
// creating it when needed: the agent-facing side uses the dev server
// certificate and trusts the dev CA for agents; the upstream side trusts
// the dev CA for daemons and presents a relay client certificate (signed
// by the dev CA, no runner URI), created as relay-client.pem on first use.
// Development and demos only.
func DevRelay(dir string, r *config.Relay) (*trust.DevPKI, error) {
	pki, err := trust.GenerateDevPKI(dir, trust.DevPKIOptions{})
	if err != nil {
		return nil, err
	}
	certFile, keyFile := filepath.Join(pki.Dir, DevRelayCertFile), filepath.Join(pki.Dir, DevRelayKeyFile)
	if err := ensureDevRelayCert(pki, certFile, keyFile); err != nil {
		return nil, err
	}
	r.TLS = config.ServerTLS{Certificate: pki.Server.CertFile, PrivateKey: pki.Server.KeyFile, ClientCA: pki.CA.CertFile}
	r.Upstream.CA, r.Upstream.Certificate, r.Upstream.PrivateKey = pki.CA.CertFile, certFile, keyFile
	return pki, nil
}

// ensureDevRelayCert keeps a valid relay certificate of pki's CA, or
// issues a new one.
func ensureDevRelayCert(pki *trust.DevPKI, certFile, keyFile string) error {
	caPEM, err := os.ReadFile(pki.CA.CertFile)
	if err != nil {
		return err
	}
	caBlock, _ := pem.Decode(caPEM)
	if caBlock == nil {
		return fmt.Errorf("%s: no PEM certificate", pki.CA.CertFile)
	}
	ca, err := x509.ParseCertificate(caBlock.Bytes)
	if err != nil {
		return fmt.Errorf("%s: %w", pki.CA.CertFile, err)
	}
	if pair, err := tls.LoadX509KeyPair(certFile, keyFile); err == nil && pair.Leaf != nil {
		pool := x509.NewCertPool()
		pool.AddCert(ca)
		if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			CurrentTime: time.Now().Add(24 * time.Hour)}); err == nil {
			return nil // reuse: valid for at least another day
		}
	}
	keyPEM, err := os.ReadFile(filepath.Join(pki.Dir, trust.DevCAKeyFile))
	if err != nil {
		return err
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return fmt.Errorf("%s: no PEM key", trust.DevCAKeyFile)
	}
	var caKey any
	if caKey, err = x509.ParsePKCS8PrivateKey(kb.Bytes); err != nil {
		if caKey, err = x509.ParseECPrivateKey(kb.Bytes); err != nil {
			return fmt.Errorf("%s: %w", trust.DevCAKeyFile, err)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return err
	}
	now := time.Now()
	notAfter := now.Add(trust.DevLeafValidity)
	if ca.NotAfter.Before(notAfter) {
		notAfter = ca.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "forgeyard-relay (development)", Organization: []string{"Forgeyard dev PKI"}},
		NotBefore:    now.Add(-trust.DevBackdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("issuing the dev relay certificate: %w", err)
	}
	// Atomic, key 0600 whatever an older file's mode was (os.WriteFile
	// keeps an existing file's mode).
	return trust.WriteCredentialFiles(certFile, keyFile, [][]byte{der}, key)
}
