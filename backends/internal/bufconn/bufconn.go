// Package bufconn hands on a connection from which a header was read
// through a bufio.Reader: the bytes the reader buffered beyond the header
// belong to what follows, so they are read first. backends/yamux (the
// HTTP/1.1 Upgrade form) and backends/yamux/proxy (the HTTP CONNECT
// response) use it.
package bufconn

import (
	"bufio"
	"net"
)

// Wrap returns nc when br buffered nothing, else a net.Conn whose reads
// return br's buffered bytes first and then go straight to nc.
func Wrap(nc net.Conn, br *bufio.Reader) net.Conn {
	if br.Buffered() == 0 {
		return nc
	}
	return &conn{Conn: nc, r: br}
}

// conn reads the bytes br buffered first.
type conn struct {
	net.Conn
	r *bufio.Reader
}

func (c *conn) Read(p []byte) (int, error) {
	if c.r != nil {
		if c.r.Buffered() > 0 {
			return c.r.Read(p)
		}
		c.r = nil
	}
	return c.Conn.Read(p)
}
