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
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
)

// ALPN is the protocol both sides offer (the product's, so TLS does the
// same work).
const ALPN = "forgeyard/1"

// KeepAlive is the client's keep-alive period (a PING every 10 s, the
// product's default heartbeat interval).
const KeepAlive = 10 * time.Second

// Server accepts raw connections and holds them; it echoes the one byte
// each connection's stream carries.
type Server struct {
	ln    *quic.Listener
	held  atomic.Int64
	mu    sync.Mutex
	conns []*quic.Conn
}

// Listen listens on addr ("127.0.0.1:0") with quic-go's default Config.
func Listen(addr string, conf *tls.Config) (*Server, error) {
	tc := conf.Clone()
	tc.NextProtos = []string{ALPN}
	ln, err := quic.ListenAddr(addr, tc, &quic.Config{})
	if err != nil {
		return nil, err
	}
	return &Server{ln: ln}, nil
}

// Addr is the listening address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Held is the number of connections whose stream delivered its byte.
func (s *Server) Held() int64 { return s.held.Load() }

// Serve accepts until ctx ends or the listener fails, then closes every
// connection.
func (s *Server) Serve(ctx context.Context) error {
	defer func() {
		s.mu.Lock()
		for _, c := range s.conns {
			_ = c.CloseWithError(0, "")
		}
		s.mu.Unlock()
	}()
	stop := context.AfterFunc(ctx, func() { _ = s.ln.Close() })
	defer stop()
	for {
		c, err := s.ln.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		go func() {
			st, err := c.AcceptStream(ctx)
			if err != nil {
				return
			}
			var b [1]byte
			if _, err := st.Read(b[:]); err != nil {
				return
			}
			if _, err := st.Write(b[:]); err == nil { // the echo tells the client it is held
				s.held.Add(1)
			}
		}()
	}
}

// Client holds raw client connections, dialed over one shared UDP socket
// (quic.Transport) per source address.
type Client struct {
	mu    sync.Mutex
	trs   []*quic.Transport
	conns []*quic.Conn
	dials atomic.Int64
}

// Dials is the number of handshakes the client began (retries included).
func (c *Client) Dials() int64 { return c.dials.Load() }

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
	sources = min(max(sources, 1), 254)
	c := &Client{}
	for i := range sources {
		pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, byte(1+i))})
		if err != nil {
			c.Close()
			return nil, err
		}
		c.trs = append(c.trs, &quic.Transport{Conn: pc})
	}
	qc := &quic.Config{KeepAlivePeriod: KeepAlive}
	sem := make(chan struct{}, max(parallel, 1))
	var wg sync.WaitGroup
	var first atomic.Pointer[error]
	for i := range n {
		if first.Load() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			var err error
			// A handshake the server's accept queue refused fails the
			// echo, not the dial: try again at once (up to maxTries
			// times), as a plain client does.
			for try := 0; try < maxTries; try++ {
				if err = c.dialOne(ctx, c.trs[i%len(c.trs)], ua, conf(i), qc); err == nil || ctx.Err() != nil {
					break
				}
			}
			if err != nil {
				e := fmt.Errorf("rawbench: connection %d: %w", i, err)
				first.CompareAndSwap(nil, &e)
			}
		}()
	}
	wg.Wait()
	if e := first.Load(); e != nil {
		c.Close()
		return nil, *e
	}
	return c, nil
}

// maxTries bounds a connection's handshakes in DialN.
const maxTries = 20

func (c *Client) dialOne(ctx context.Context, tr *quic.Transport, ua *net.UDPAddr, conf *tls.Config, qc *quic.Config) error {
	c.dials.Add(1)
	tc := conf.Clone()
	tc.NextProtos = []string{ALPN}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := tr.Dial(ctx, ua, tc, qc)
	if err != nil {
		return err
	}
	err = echo(ctx, conn)
	if err != nil {
		_ = conn.CloseWithError(0, "")
		return err
	}
	c.mu.Lock()
	c.conns = append(c.conns, conn)
	c.mu.Unlock()
	return nil
}

// echo writes one byte on a new stream and reads the server's echo.
func echo(ctx context.Context, conn *quic.Conn) error {
	st, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok {
		_ = st.SetDeadline(d)
	}
	if _, err := st.Write([]byte{1}); err != nil {
		return err
	}
	var b [1]byte
	_, err = st.Read(b[:])
	return err
}

// Len is the number of connections held.
func (c *Client) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.conns)
}

// Close closes every connection and socket.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, conn := range c.conns {
		errs = append(errs, conn.CloseWithError(0, ""))
	}
	for _, tr := range c.trs {
		errs = append(errs, tr.Close())
	}
	_ = errors.Join(errs...)
	c.conns, c.trs = nil, nil
}
