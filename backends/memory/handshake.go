package memory

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"
)

// Alike in shape to other packages' sentinel-error blocks, but these are
// crypto/tls's alert texts, each a stable API value.
// Handshake errors as the peer of a real TLS stack would report them. The
// side that detects a problem returns the verification error; the other
// side sees an alert, which the dialer reports as one of these.
var (
	// ErrBadCertificate: the server rejected the client certificate.
	ErrBadCertificate = errors.New("remote error: tls: bad certificate")
	// ErrCertificateRequired: the server requires a client certificate.
	ErrCertificateRequired = errors.New("remote error: tls: certificate required")
	// ErrNoApplicationProtocol: no common ALPN protocol.
	ErrNoApplicationProtocol = errors.New("remote error: tls: no application protocol")
)

// handshake performs the certificate checks of a TLS 1.3 handshake between
// client and server, returning both connection states. The client dialled
// addr.
func handshake(client, server *tls.Config, addr string) (cst, sst tls.ConnectionState, err error) {
	serverName := client.ServerName
	if serverName == "" {
		serverName = addr
		if h, _, err := net.SplitHostPort(addr); err == nil {
			serverName = h
		}
	}
	if tooOld(client) || tooOld(server) {
		return cst, sst, errors.New("tls: no supported versions satisfy MinVersion and MaxVersion (TLS 1.3 required)")
	}
	hello := &tls.ClientHelloInfo{ServerName: serverName, SupportedProtos: client.NextProtos,
		SupportedVersions: []uint16{tls.VersionTLS13}}
	if server.GetConfigForClient != nil {
		c, err := server.GetConfigForClient(hello)
		if err != nil {
			return cst, sst, fmt.Errorf("server: %w", err)
		}
		if c != nil {
			server = c
		}
	}

	// ALPN: the server's preference among the client's offers.
	proto := ""
	if len(client.NextProtos) > 0 && len(server.NextProtos) > 0 {
		for _, p := range server.NextProtos {
			if slices.Contains(client.NextProtos, p) {
				proto = p
				break
			}
		}
		if proto == "" {
			return cst, sst, ErrNoApplicationProtocol
		}
	}

	// Server certificate.
	var scert *tls.Certificate
	if server.GetCertificate != nil {
		if scert, err = server.GetCertificate(hello); err != nil {
			return cst, sst, fmt.Errorf("server: %w", err)
		}
	} else if len(server.Certificates) > 0 {
		scert = &server.Certificates[0]
	}
	if scert == nil || len(scert.Certificate) == 0 {
		return cst, sst, errors.New("server: tls: no certificates configured")
	}
	schain, err := parseChain(scert.Certificate)
	if err != nil {
		return cst, sst, fmt.Errorf("server certificate: %w", err)
	}
	var sverified [][]*x509.Certificate
	if !client.InsecureSkipVerify {
		sverified, err = verify(schain, client.RootCAs, serverName, now(client), x509.ExtKeyUsageServerAuth)
		if err != nil {
			return cst, sst, err
		}
	}
	if client.VerifyPeerCertificate != nil {
		if err := client.VerifyPeerCertificate(scert.Certificate, sverified); err != nil {
			return cst, sst, err
		}
	}

	// Client certificate.
	var cchain []*x509.Certificate
	var craw [][]byte
	var cverified [][]*x509.Certificate
	if server.ClientAuth != tls.NoClientCert {
		var ccert *tls.Certificate
		if client.GetClientCertificate != nil {
			if ccert, err = client.GetClientCertificate(&tls.CertificateRequestInfo{Version: tls.VersionTLS13}); err != nil {
				return cst, sst, err
			}
		} else if len(client.Certificates) > 0 {
			ccert = &client.Certificates[0]
		}
		if ccert != nil && len(ccert.Certificate) > 0 {
			craw = ccert.Certificate
			if cchain, err = parseChain(craw); err != nil {
				return cst, sst, ErrBadCertificate
			}
		}
		switch server.ClientAuth {
		case tls.RequireAnyClientCert, tls.RequireAndVerifyClientCert:
			if len(cchain) == 0 {
				return cst, sst, ErrCertificateRequired
			}
		}
		if len(cchain) > 0 && (server.ClientAuth == tls.VerifyClientCertIfGiven || server.ClientAuth == tls.RequireAndVerifyClientCert) {
			if cverified, err = verify(cchain, server.ClientCAs, "", now(server), x509.ExtKeyUsageClientAuth); err != nil {
				return cst, sst, fmt.Errorf("%w (server: %v)", ErrBadCertificate, err)
			}
		}
		if server.VerifyPeerCertificate != nil {
			if err := server.VerifyPeerCertificate(craw, cverified); err != nil {
				return cst, sst, fmt.Errorf("%w (server: %v)", ErrBadCertificate, err)
			}
		}
	}

	base := tls.ConnectionState{Version: tls.VersionTLS13, HandshakeComplete: true,
		CipherSuite: tls.TLS_AES_128_GCM_SHA256, NegotiatedProtocol: proto, ServerName: serverName}
	cst, sst = base, base
	cst.PeerCertificates, cst.VerifiedChains = schain, sverified
	sst.PeerCertificates, sst.VerifiedChains = cchain, cverified
	if client.VerifyConnection != nil {
		if err := client.VerifyConnection(cst); err != nil {
			return cst, sst, err
		}
	}
	if server.VerifyConnection != nil {
		if err := server.VerifyConnection(sst); err != nil {
			return cst, sst, fmt.Errorf("%w (server: %v)", ErrBadCertificate, err)
		}
	}
	return cst, sst, nil
}

func tooOld(c *tls.Config) bool { return c.MaxVersion != 0 && c.MaxVersion < tls.VersionTLS13 }

func now(c *tls.Config) time.Time {
	if c.Time != nil {
		return c.Time()
	}
	return time.Now()
}

func parseChain(ders [][]byte) ([]*x509.Certificate, error) {
	out := make([]*x509.Certificate, 0, len(ders))
	for _, d := range ders {
		c, err := x509.ParseCertificate(d)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// verify checks chain[0] against roots as crypto/tls does, returning a
// *tls.CertificateVerificationError on failure.
func verify(chain []*x509.Certificate, roots *x509.CertPool, dnsName string, at time.Time, usage x509.ExtKeyUsage) ([][]*x509.Certificate, error) {
	opts := x509.VerifyOptions{Roots: roots, CurrentTime: at, DNSName: dnsName,
		Intermediates: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{usage}}
	for _, c := range chain[1:] {
		opts.Intermediates.AddCert(c)
	}
	chains, err := chain[0].Verify(opts)
	if err != nil {
		return nil, &tls.CertificateVerificationError{UnverifiedCertificates: chain, Err: err}
	}
	return chains, nil
}
