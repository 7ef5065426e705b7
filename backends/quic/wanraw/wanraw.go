// Package wanraw is the raw quic-go baseline of the WAN benchmark
// (internal/testkit/wanbench, `make bench-wan`): plain quic-go connections with
// quic-go's default Config (plus ALPN forgeyard/1), whose bidirectional
// streams are handed out as io.ReadWriteClosers so that the benchmark can
// drive them exactly like the project's streams without importing quic-go
// (only backends/quic and backends/webtransport may, internal/testkit/deptest).
//
// It is a measuring tool, not a transport; nothing in the product uses it.
package wanraw

import (
	"context"
	"crypto/tls"
	"io"
	"net"

	"github.com/quic-go/quic-go"

	"forgeyard.dev/transport/backends/internal/rawkit"
)

// ALPN is the protocol both sides offer (the product's, so TLS does the
// same work).
const ALPN = rawkit.ALPN

// Listener accepts raw connections.
type Listener struct{ ln *quic.Listener }

// Listen listens on addr ("127.0.0.1:0") with quic-go's default Config.
func Listen(addr string, conf *tls.Config) (*Listener, error) {
	tc := rawkit.TLS(conf)
	ln, err := quic.ListenAddr(addr, tc, &quic.Config{})
	if err != nil {
		return nil, err
	}
	return &Listener{ln: ln}, nil
}

// Addr is the listening address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Close stops listening (accepted connections stay up).
func (l *Listener) Close() error { return l.ln.Close() }

// Accept waits for the next connection.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	c, err := l.ln.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return &Conn{c: c}, nil
}

// Dial connects to addr with quic-go's default Config.
func Dial(ctx context.Context, addr string, conf *tls.Config) (*Conn, error) {
	tc := rawkit.TLS(conf)
	c, err := quic.DialAddr(ctx, addr, tc, &quic.Config{})
	if err != nil {
		return nil, err
	}
	return &Conn{c: c}, nil
}

// Conn is one raw connection.
type Conn struct{ c *quic.Conn }

// OpenStream opens a bidirectional stream. The peer sees it once the
// first byte is written. Close ends the write side only.
func (c *Conn) OpenStream(ctx context.Context) (io.ReadWriteCloser, error) {
	return c.c.OpenStreamSync(ctx)
}

// AcceptStream waits for the peer's next bidirectional stream.
func (c *Conn) AcceptStream(ctx context.Context) (io.ReadWriteCloser, error) {
	return c.c.AcceptStream(ctx)
}

// Close closes the connection (application error 0).
func (c *Conn) Close() error { return c.c.CloseWithError(0, "") }
