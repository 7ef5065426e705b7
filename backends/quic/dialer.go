package quic

import (
	"context"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"net"
	"time"

	quicgo "github.com/quic-go/quic-go"

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
	// LocalAddr, when not empty, is the local "host:port" the dial's own
	// UDP socket binds to (port 0 picks one), e.g. to spread many clients
	// over loopback addresses. Ignored with Transport.
	LocalAddr string
	// Transport, when not nil, dials from its shared UDP socket instead of
	// a fresh socket per connection (one socket serving many connections,
	// as a load generator or a proxy wants).
	Transport *Transport
}

// Transport is one client UDP socket shared by the connections dialled
// through it (Dialer.Transport). The socket closes once Close was called
// and every connection dialled through it has ended.
type Transport struct{ ep *endpoint }

// NewTransport opens a shared client socket on local ("host:port"; port 0
// picks one).
func NewTransport(local string) (*Transport, error) {
	ep, err := newDialEndpoint("udp", local)
	if err != nil {
		return nil, fmt.Errorf("quic: transport %s: %w", local, err)
	}
	return &Transport{ep: ep}, nil
}

// LocalAddr is the socket's address.
func (t *Transport) LocalAddr() net.Addr { return t.ep.udp.LocalAddr() }

// Close drops the owner's reference: no new dials; the socket closes with
// the last connection. Calling it more than once is a no-op.
func (t *Transport) Close() error {
	if t.ep.users.Disown() {
		t.ep.release()
	}
	return nil
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
	var ep *endpoint
	if d.Transport != nil {
		ep = d.Transport.ep
		if !ep.acquireShared() {
			return nil, fmt.Errorf("quic: dial %s: the shared Transport is closed", addr)
		}
	} else {
		local := d.LocalAddr
		if local == "" {
			local = "0.0.0.0:0"
			if ua.IP.To4() == nil && ua.IP != nil {
				local = "[::]:0"
			}
		}
		if ep, err = newDialEndpoint("udp", local); err != nil {
			return nil, fmt.Errorf("quic: dial %s: %w", addr, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.HandshakeTimeout)
	defer cancel()
	qc, retry, err := dialPaced(ctx, ep.tr, ua, tc, cfg)
	if err != nil {
		ep.release()
		err = fmt.Errorf("quic: dial %s: %w", addr, TranslateError(err))
		if retry > 0 {
			err = &retryError{After: retry, Err: err}
		}
		return nil, err
	}
	checkUDPBuffers(ep.udp, cfg.Logger)
	if err := checkALPN(qc); err != nil {
		ep.release()
		return nil, err
	}
	// The connection holds a reference to the endpoint (its only one
	// without a shared Transport): the socket closes with the last.
	c := newConn(qc, ep.release, cfg.DelayHintMaxRTT)
	c.credit = cfg.streamCredit()
	ep.watchHints(c)
	return c, nil
}

// dialPaced dials through tr; with Config.RefusalBackoff a refusal before
// the handshake (the server's CONNECTION_REFUSED) is waited out and the
// dial tried again while ctx allows: after the refusal's retry hint (plus
// up to a tenth of it of jitter) when it carries one, else after
// refusalWait. A hint beyond ctx's deadline ends the dial with a
// *retryError carrying it.
func dialPaced(ctx context.Context, tr *quicgo.Transport, ua *net.UDPAddr, tc *tls.Config, cfg Config) (*quicgo.Conn, time.Duration, error) {
	for n := 0; ; n++ {
		qc, err := tr.Dial(ctx, ua, tc, cfg.quicConfig())
		if err == nil || cfg.RefusalBackoff <= 0 {
			return qc, 0, err
		}
		hint, refused := refusalHint(err)
		if !refused {
			return nil, 0, err
		}
		wait := refusalWait(cfg.RefusalBackoff, n, rand.Int64N)
		if hint > 0 {
			wait = hint + time.Duration(rand.Int64N(int64(hint/10)+1))
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return nil, wait, err // no time left for another try: the refusal is the answer
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, 0, err
		case <-t.C:
		}
	}
}

// refusalWait is the n-th wait after a refusal: uniform in [d/2, d],
// d = min(base·2ⁿ, MaxRefusalBackoff), drawn with randN.
func refusalWait(base time.Duration, n int, randN func(int64) int64) time.Duration {
	d := base
	for i := 0; i < n && d < MaxRefusalBackoff; i++ {
		d *= 2
	}
	d = min(d, MaxRefusalBackoff)
	return d/2 + time.Duration(randN(int64(d/2)+1))
}
