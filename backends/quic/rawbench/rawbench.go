// Package rawbench is the raw quic-go baseline of the scale harness
// (internal/tools/loadgen, `make scale`): connections made with quic-go's
// defaults (plus ALPN forgeyard/1 and, on the client, a keep-alive so an
// idle connection outlives the idle timeout), each with one stream that
// carried one byte, held idle. The daemon-side memory of our agents is
// reported as a ratio of this one's, measured by the same method (a
// separate server process's /proc figures).
//
// It lives under backends/quic because only backends/quic and
// backends/webtransport may import quic-go (internal/testkit/deptest); it is
// a measuring tool, not a transport, and nothing in the product uses it.
package rawbench

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"time"

	"github.com/quic-go/quic-go"

	"forgeyard.dev/transport/backends/internal/rawkit"
)

// ALPN is the protocol both sides offer (the product's, so TLS does the
// same work).
const ALPN = rawkit.ALPN

// KeepAlive is the client's keep-alive period (a PING every 10 s, the
// product's default heartbeat interval).
const KeepAlive = 10 * time.Second

// Server accepts raw connections and holds them; it echoes the one byte
// each connection's stream carries.
type Server struct {
	ln   *quic.Listener
	held rawkit.Server[*quic.Conn]
}

// Listen, Addr, Held and Serve are shaped like backends/yamux/rawbench's on purpose
// (internal/tools/loadgen drives both through one interface); what is
// not the library's is backends/internal/rawkit.
//
// Listen listens on addr ("127.0.0.1:0") with quic-go's default Config.
func Listen(addr string, conf *tls.Config) (*Server, error) {
	ln, err := quic.ListenAddr(addr, rawkit.TLS(conf), &quic.Config{})
	if err != nil {
		return nil, err
	}
	return &Server{ln: ln}, nil
}

// Addr is the listening address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Held is the number of connections whose stream delivered its byte.
func (s *Server) Held() int64 { return s.held.Held() }

// Serve accepts until ctx ends or the listener fails, then closes every
// connection.
func (s *Server) Serve(ctx context.Context) error {
	defer s.held.Conns.CloseAll(closeConn)
	return rawkit.Serve(ctx, s.ln, s.ln.Accept, func(c *quic.Conn) {
		s.held.Conns.Add(c)
		go func() {
			if st, err := c.AcceptStream(ctx); err == nil {
				s.held.Echo(st)
			}
		}()
	})
}

func closeConn(c *quic.Conn) error { return c.CloseWithError(0, "") }

// Client holds raw client connections, dialed over one shared UDP socket
// (quic.Transport) per source address.
type Client struct {
	trs           []*quic.Transport
	conns         rawkit.Held[*quic.Conn]
	rawkit.Client // the pinged streams, StartEcho, Dials
}

// EchoAll starts the server's side of the steady echo (rawkit.Server.EchoAll).
func (s *Server) EchoAll() { s.held.EchoAll() }

// DialN dials n connections to addr, parallel at a time, from the
// loopback addresses 127.0.0.1 … 127.0.0.<sources> (one shared socket
// each); conf(i) is connection i's TLS configuration. It returns when
// every connection's byte was echoed by the server, or on the first
// error.
func DialN(ctx context.Context, addr string, n, parallel, sources int, conf func(i int) *tls.Config) (*Client, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, err
	}
	trs, err := Transports(sources)
	if err != nil {
		return nil, err
	}
	c := &Client{trs: trs}
	qc := &quic.Config{KeepAlivePeriod: KeepAlive}
	err = rawkit.DialN(ctx, n, parallel, "connection", func(i int) error {
		return c.dialOne(ctx, c.trs[i%len(c.trs)], ua, conf(i), qc)
	})
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Client) dialOne(ctx context.Context, tr *quic.Transport, ua *net.UDPAddr, conf *tls.Config, qc *quic.Config) error {
	c.Dialed()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := tr.Dial(ctx, ua, rawkit.TLS(conf), qc)
	if err != nil {
		return err
	}
	st, err := conn.OpenStreamSync(ctx)
	if err == nil {
		err = rawkit.Ping(ctx, st) // the server's echo: it holds the connection
	}
	if err != nil {
		_ = conn.CloseWithError(0, "")
		return err
	}
	c.conns.Add(conn)
	c.Streams.Add(st)
	return nil
}

// Len is the number of connections held.
func (c *Client) Len() int { return c.conns.Len() }

// Close closes every connection and socket.
func (c *Client) Close() {
	_ = errors.Join(c.conns.CloseAll(closeConn), CloseTransports(c.trs))
	c.trs = nil
}

// Transports opens the raw clients' sockets: one quic.Transport per
// loopback source address 127.0.0.1 … 127.0.0.<sources> (clamped to
// 1–254). backends/webtransport/rawbench dials from the same.
func Transports(sources int) ([]*quic.Transport, error) {
	sources = min(max(sources, 1), 254)
	var trs []*quic.Transport
	for i := range sources {
		pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, byte(1+i))})
		if err != nil {
			_ = CloseTransports(trs)
			return nil, err
		}
		trs = append(trs, &quic.Transport{Conn: pc})
	}
	return trs, nil
}

// CloseTransports closes what Transports opened.
func CloseTransports(trs []*quic.Transport) error {
	var errs []error
	for _, tr := range trs {
		errs = append(errs, tr.Close())
	}
	return errors.Join(errs...)
}
