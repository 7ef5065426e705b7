package quic

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"

	quicgo "github.com/quic-go/quic-go"

	"forgeyard.dev/transport/backends/internal/refcount"
	"forgeyard.dev/transport/semantics"
)

// endpoint owns one UDP socket and the quic-go Transport on it. It closes
// both once its owner (a Listener, or the single dialled connection) and
// every connection using it are done, so closing a Listener stops
// accepting without cutting established connections (like net.Listener).
type endpoint struct {
	udp *net.UDPConn
	tr  *quicgo.Transport

	// users counts the live connections plus the owner (a Listener, or a
	// shared Transport until its Close: Disown).
	users *refcount.Users

	mu sync.Mutex
	// The connections dialled from this socket, which hear restart
	// hints (restarthint.go; the socket's read path hands them to hinted:
	// dialSocket); nil until the first dial. Guarded by mu.
	dialled map[*conn]struct{}
}

// newEndpoint opens a UDP socket on addr ("host:port"; port 0 picks one).
func newEndpoint(network, addr string) (*endpoint, error) {
	ua, err := net.ResolveUDPAddr(network, addr)
	if err != nil {
		return nil, err
	}
	prepareUDPBufferWarning()
	udp, err := net.ListenUDP(network, ua)
	if err != nil {
		return nil, err
	}
	return &endpoint{udp: udp, tr: &quicgo.Transport{Conn: udp}, users: refcount.New()}, nil
}

// newDialEndpoint is newEndpoint for dialling: restart hints are taken
// out of the socket's read path (NewHintSocket) and passed to the
// connections dialled from it.
func newDialEndpoint(network, addr string) (*endpoint, error) {
	e, err := newEndpoint(network, addr)
	if err != nil {
		return nil, err
	}
	e.tr.Conn = NewHintSocket(e.udp, e.hinted)
	return e, nil
}

// acquire registers a connection; false if the endpoint already closed.
func (e *endpoint) acquire() bool { return e.users.Acquire() }

// acquireShared is acquire for a dial through a shared Transport: false
// also once the Transport's owner closed it.
func (e *endpoint) acquireShared() bool { return e.users.AcquireOwned() }

// release drops one user and closes the endpoint with the last.
func (e *endpoint) release() {
	if e.users.Release() {
		_ = e.tr.Close()
		_ = e.udp.Close()
	}
}

// watchHints makes c, dialled from this socket, hear restart hints from
// its peer (conn.PeerHints, conn.PeerRestarted).
func (e *endpoint) watchHints(c *conn) {
	c.hints = NewHintTarget()
	e.mu.Lock()
	if e.dialled == nil {
		e.dialled = make(map[*conn]struct{})
	}
	e.dialled[c] = struct{}{}
	e.mu.Unlock()
	context.AfterFunc(c.ctx, func() {
		e.mu.Lock()
		delete(e.dialled, c)
		e.mu.Unlock()
	})
}

// hinted passes a restart hint from `from`, carrying tok (zero: none),
// to the connections with that peer (HintTarget.Deliver: only the one
// armed with tok ends; those armed with another token of the same key
// ignore it). It runs on quic-go's read loop (NewHintSocket): a few
// comparisons and non-blocking sends per connection.
func (e *endpoint) hinted(from netip.AddrPort, tok semantics.RestartToken) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for c := range e.dialled {
		if c.remote == from {
			c.hints.Deliver(tok)
		}
	}
}

// prepareTLS clones conf for QUIC: TLS 1.3 only and ALPN offered first.
func prepareTLS(conf *tls.Config) (*tls.Config, error) {
	if conf == nil {
		return nil, errors.New("quic: a *tls.Config is required (TLS 1.3 with certificates; no insecure mode)")
	}
	c := conf.Clone()
	c.MinVersion = tls.VersionTLS13
	c.MaxVersion = 0
	if !slices.Contains(c.NextProtos, ALPN) {
		c.NextProtos = append([]string{ALPN}, c.NextProtos...)
	}
	return c, nil
}
