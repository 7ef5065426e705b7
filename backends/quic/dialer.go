package quic

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"

	"forgeyard.dev/transport/semantics"
)

var _ semantics.BackendDialer = Dialer{}

// Dialer dials QUIC connections. The zero Config is ready to use; TLS is
// required (TLS 1.3 with RootCAs/ServerName, and Certificates for mTLS).
// A Dialer is a value: it is safe for concurrent use and holds no state.
type Dialer struct {
	// TLS is cloned for every dial; TLS 1.3 only and ALPN "forgeyard/1"
	// are added.
	TLS *tls.Config
	// Config is validated and copied on every dial.
	Config Config
}

// Dial connects to addr ("host:port") from a fresh UDP socket, which closes
// with the connection. It returns once the handshake completed, or ctx is
// done, or Config.HandshakeTimeout passed. Errors are translated (a TLS
// alert becomes a *semantics.ConnError with CloseAuthenticationFailure).
//
// In TLS 1.3 the server verifies the client certificate after the client
// finished its handshake, so a rejected client certificate can surface as
// a *semantics.ConnError (CloseAuthenticationFailure, Remote) from the
// first operation on the connection instead of from Dial.
func (d Dialer) Dial(ctx context.Context, addr string) (semantics.BackendConn, error) {
	cfg, err := d.Config.checked()
	if err != nil {
		return nil, err
	}
	tc, err := prepareTLS(d.TLS)
	if err != nil {
		return nil, err
	}
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("quic: dial %s: %w", addr, err)
	}
	local := "0.0.0.0:0"
	if ua.IP.To4() == nil && ua.IP != nil {
		local = "[::]:0"
	}
	ep, err := newEndpoint("udp", local)
	if err != nil {
		return nil, fmt.Errorf("quic: dial %s: %w", addr, err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.HandshakeTimeout)
	defer cancel()
	qc, err := ep.tr.Dial(ctx, ua, tc, cfg.quicConfig())
	if err != nil {
		ep.release()
		return nil, fmt.Errorf("quic: dial %s: %w", addr, TranslateError(err))
	}
	checkUDPBuffers(ep.udp, cfg.Logger)
	if err := checkALPN(qc); err != nil {
		ep.release()
		return nil, err
	}
	// The connection holds the endpoint's only reference: the socket closes
	// with it.
	c := newConn(qc, ep.release, cfg.DelayHintMaxRTT)
	c.credit = cfg.streamCredit()
	return c, nil
}
