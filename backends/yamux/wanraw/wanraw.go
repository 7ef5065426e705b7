// Package wanraw is the raw TLS+yamux baseline of the WAN benchmark
// (internal/testkit/wanbench, `make bench-wan`): hashicorp/yamux sessions over TLS
// 1.3 on TCP with no project code — yamux's DefaultConfig with a 16 MiB
// stream window, the same raw configuration as the loopback benchmarks of
// backends/yamux — whose streams are handed out as io.ReadWriteClosers so
// that the benchmark can drive them without importing yamux (only
// backends/yamux may, internal/testkit/deptest).
//
// It is a measuring tool, not a transport; nothing in the product uses it.
package wanraw

import (
	"context"
	"crypto/tls"
	"io"
	"net"

	"github.com/hashicorp/yamux"

	"forgeyard.dev/transport/backends/internal/rawkit"
)

// ALPN is the protocol both sides offer (the product's, so TLS does the
// same work).
const ALPN = rawkit.ALPN

// StreamWindow is the raw sessions' maximum stream window.
const StreamWindow = 16 << 20

func config() *yamux.Config {
	c := yamux.DefaultConfig()
	c.MaxStreamWindowSize = StreamWindow
	c.LogOutput = io.Discard
	return c
}

// Listener accepts raw sessions.
type Listener struct {
	ln   net.Listener
	conf *tls.Config
}

// Listen listens on addr ("127.0.0.1:0").
func Listen(addr string, conf *tls.Config) (*Listener, error) {
	tc := rawkit.TLS(conf)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &Listener{ln: ln, conf: tc}, nil
}

// Addr is the listening address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Close stops listening (accepted sessions stay up).
func (l *Listener) Close() error { return l.ln.Close() }

// Accept waits for the next session (TLS handshake included).
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	nc, err := l.ln.Accept()
	if err != nil {
		return nil, err
	}
	tc := tls.Server(nc, l.conf)
	if err := tc.HandshakeContext(ctx); err != nil {
		nc.Close()
		return nil, err
	}
	return newConn(tc, yamux.Server)
}

// Dial connects to addr.
func Dial(ctx context.Context, addr string, conf *tls.Config) (*Conn, error) {
	tc := rawkit.TLS(conf)
	d := tls.Dialer{Config: tc}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return newConn(nc, yamux.Client)
}

// newConn starts yamux's side (yamux.Server or yamux.Client) of a session
// on nc, closing nc if that fails.
func newConn(nc net.Conn, side func(io.ReadWriteCloser, *yamux.Config) (*yamux.Session, error)) (*Conn, error) {
	s, err := side(nc, config())
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &Conn{s: s}, nil
}

// Conn is one raw session.
type Conn struct{ s *yamux.Session }

// OpenStream opens a stream. Close ends the write side only.
func (c *Conn) OpenStream(ctx context.Context) (io.ReadWriteCloser, error) {
	return c.s.OpenStream()
}

// AcceptStream waits for the peer's next stream.
func (c *Conn) AcceptStream(ctx context.Context) (io.ReadWriteCloser, error) {
	return c.s.AcceptStreamWithContext(ctx)
}

// Close closes the session and its TCP connection.
func (c *Conn) Close() error { return c.s.Close() }
