package webtransport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	quicgo "github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	wt "github.com/quic-go/webtransport-go"

	fyquic "forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

var _ semantics.BackendDialer = Dialer{}

// Dialer establishes WebTransport sessions, one QUIC connection each. It
// holds no state and is safe for concurrent use.
type Dialer struct {
	// TLS is cloned for every dial (TLS 1.3 only, ALPN "h3"). When its
	// ServerName is empty, the URL's host name is used.
	TLS *tls.Config
	// Config is validated and copied on every dial.
	Config Config
}

// URL returns the agent endpoint URL for hostport ("host:port").
func URL(hostport string) string { return "https://" + hostport + Path }

// Dial establishes a session at addr, either a full URL
// ("https://host:port/.well-known/forgeyard/agent") or "host:port" (Path
// is then implied). It returns once the session is established and
// "forgeyard/1" was selected; errors are translated like backends/quic's.
func (d Dialer) Dial(ctx context.Context, addr string) (semantics.BackendConn, error) {
	qconf, err := quicConfig(d.Config)
	if err != nil {
		return nil, err
	}
	if d.TLS == nil {
		return nil, errors.New("webtransport: a *tls.Config is required (TLS 1.3 with certificates; no insecure mode)")
	}
	u, err := parseURL(addr)
	if err != nil {
		return nil, err
	}
	tc := d.TLS.Clone()
	tc.MinVersion, tc.MaxVersion = tls.VersionTLS13, 0
	tc.NextProtos = []string{http3.NextProtoH3}
	if tc.ServerName == "" {
		tc.ServerName = u.Hostname()
	}
	ua, err := net.ResolveUDPAddr("udp", u.Host)
	if err != nil {
		return nil, fmt.Errorf("webtransport: dial %s: %w", addr, err)
	}
	udp, err := net.ListenUDP("udp", nil)
	if err != nil {
		return nil, fmt.Errorf("webtransport: dial %s: %w", addr, err)
	}
	// Restart hints are taken out of the socket's read path
	// (fyquic.NewHintSocket) and passed to the connection once it exists.
	peer := netip.AddrPortFrom(ua.AddrPort().Addr().Unmap(), ua.AddrPort().Port())
	var hints atomic.Pointer[fyquic.HintTarget]
	tr := &quicgo.Transport{Conn: fyquic.NewHintSocket(udp, func(from netip.AddrPort, tok semantics.RestartToken) {
		if h := hints.Load(); h != nil && from == peer {
			h.Deliver(tok)
		}
	})}
	closeEndpoint := func() { _ = tr.Close(); _ = udp.Close() }

	ctx, cancel := context.WithTimeout(ctx, handshakeTimeout(d.Config))
	defer cancel()
	qc, err := tr.Dial(ctx, ua, tc, qconf)
	if err != nil {
		closeEndpoint()
		return nil, fmt.Errorf("webtransport: dial %s: %w", addr, fyquic.TranslateError(err))
	}
	fail := func(code semantics.CloseCode, err error) (semantics.BackendConn, error) {
		_ = qc.CloseWithError(quicgo.ApplicationErrorCode(code), wire.TruncateUTF8(err.Error(), wire.MaxCloseReason))
		closeEndpoint()
		return nil, fmt.Errorf("webtransport: dial %s: %w", addr, fyquic.TranslateError(err))
	}
	wtr := &wt.Transport{ApplicationProtocols: []string{ApplicationProtocol}}
	defer wtr.Close()
	cc, err := wtr.NewClientConn(qc)
	if err != nil {
		return fail(wire.CloseInternalError, err)
	}
	rsp, sess, err := cc.Dial(ctx, u.String(), nil)
	if err != nil {
		// A crypto error (client certificate rejected) surfaces here.
		if ce := fyquic.ConnErrorOf(context.Cause(qc.Context())); ce != nil {
			err = ce
		}
		return fail(wire.CloseProtocolError, err)
	}
	if rsp.StatusCode < 200 || rsp.StatusCode > 299 {
		_ = sess.CloseWithError(wt.SessionErrorCode(wire.CloseProtocolError), "")
		return fail(wire.CloseProtocolError, fmt.Errorf("server answered HTTP %d", rsp.StatusCode))
	}
	if p := sess.SessionState().ApplicationProtocol; p != ApplicationProtocol {
		reason := fmt.Sprintf("application protocol %s required, server selected %q", ApplicationProtocol, p)
		_ = sess.CloseWithError(wt.SessionErrorCode(wire.CloseProtocolError), reason)
		return fail(wire.CloseProtocolError, &semantics.ConnError{Code: wire.CloseProtocolError, Reason: reason})
	}
	c := newConn(sess, qc, closeEndpoint, hintMaxRTT(d.Config))
	c.credit = d.Config.StreamCredit()
	c.hints = fyquic.NewHintTarget()
	hints.Store(c.hints)
	return c, nil
}

func parseURL(addr string) (*url.URL, error) {
	if !strings.Contains(addr, "://") {
		if _, _, err := net.SplitHostPort(addr); err == nil {
			addr = URL(addr)
		}
	}
	u, err := url.Parse(addr)
	if err != nil {
		return nil, fmt.Errorf("webtransport: bad address %q: %w", addr, err)
	}
	if u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("webtransport: bad address %q: want https://host:port%s or host:port", addr, Path)
	}
	if u.Port() == "" {
		u.Host = net.JoinHostPort(u.Hostname(), "443")
	}
	return u, nil
}

// handshakeTimeout bounds QUIC handshake plus session establishment.
func handshakeTimeout(c Config) time.Duration {
	if c.HandshakeTimeout > 0 {
		return c.HandshakeTimeout
	}
	return fyquic.DefaultHandshakeTimeout
}
