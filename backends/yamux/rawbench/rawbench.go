// Package rawbench is the raw TLS+yamux baseline of the scale harness
// (internal/tools/loadgen, `make scale`): TLS 1.3 over TCP with
// hashicorp/yamux's DefaultConfig (keep-alive every 30 s), one stream per
// session that carried one byte, held idle. The daemon-side memory of our
// yamux agents is reported as a ratio of this one's, measured by the same
// method (a separate server process's /proc figures).
//
// StreamPair is the raw TLS+yamux leg of the relay's CPU benchmark
// (relay, BenchmarkRelayCPU).
//
// It lives under backends/yamux because only backends/yamux may import
// yamux (internal/testkit/deptest); nothing in the product uses it.
package rawbench

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"time"

	"github.com/hashicorp/yamux"

	"forgeyard.dev/transport/backends/internal/rawkit"
)

// ALPN is the protocol both sides offer (the product's).
const ALPN = rawkit.ALPN

// Server accepts raw sessions and holds them.
type Server struct {
	ln   net.Listener
	held rawkit.Server[*yamux.Session]
}

// Listen, Addr, Held and Serve are shaped like backends/quic/rawbench's on purpose
// (internal/tools/loadgen drives both through one interface); what is
// not the library's is backends/internal/rawkit.
//
// Listen listens on addr ("127.0.0.1:0") for TLS.
func Listen(addr string, conf *tls.Config) (*Server, error) {
	ln, err := tls.Listen("tcp", addr, rawkit.TLS(conf))
	if err != nil {
		return nil, err
	}
	return &Server{ln: ln}, nil
}

// Addr is the listening address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Held is the number of sessions whose stream delivered its byte.
func (s *Server) Held() int64 { return s.held.Held() }

// Serve accepts until ctx ends or the listener fails, then closes every
// session.
func (s *Server) Serve(ctx context.Context) error {
	defer s.held.Conns.CloseAll((*yamux.Session).Close)
	accept := func(context.Context) (net.Conn, error) { return s.ln.Accept() }
	return rawkit.Serve(ctx, s.ln, accept, func(nc net.Conn) {
		go func() {
			tc := nc.(*tls.Conn)
			hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := tc.HandshakeContext(hctx); err != nil {
				_ = nc.Close()
				return
			}
			se, err := yamux.Server(nc, nil)
			if err != nil {
				_ = nc.Close()
				return
			}
			s.held.Conns.Add(se)
			if st, err := se.AcceptStream(); err == nil {
				s.held.Echo(st)
			}
		}()
	})
}

// Client holds raw client sessions.
type Client struct {
	sess          rawkit.Held[*yamux.Session]
	rawkit.Client // the pinged streams, StartEcho, Dials
}

// EchoAll starts the server's side of the steady echo (rawkit.Server.EchoAll).
func (s *Server) EchoAll() { s.held.EchoAll() }

// DialN dials n sessions to addr, parallel at a time, from the loopback
// addresses 127.0.0.1 … 127.0.0.<sources>; conf(i) is session i's TLS
// configuration. It returns when every session's stream has written its
// byte was echoed by the server, or on the first error.
func DialN(ctx context.Context, addr string, n, parallel, sources int, conf func(i int) *tls.Config) (*Client, error) {
	sources = min(max(sources, 1), 254)
	c := &Client{}
	err := rawkit.DialN(ctx, n, parallel, "session", func(i int) error {
		src := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+i%sources))}
		return c.dialOne(ctx, addr, src, conf(i))
	})
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Client) dialOne(ctx context.Context, addr string, src *net.TCPAddr, conf *tls.Config) error {
	c.Dialed()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	d := tls.Dialer{NetDialer: &net.Dialer{LocalAddr: src}, Config: rawkit.TLS(conf)}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	se, err := yamux.Client(nc, nil)
	if err != nil {
		_ = nc.Close()
		return err
	}
	st, err := se.OpenStream()
	if err == nil {
		err = rawkit.Ping(ctx, st) // the server's echo: it holds the session
	}
	if err != nil {
		_ = se.Close()
		return err
	}
	c.sess.Add(se)
	c.Streams.Add(st)
	return nil
}

// Len is the number of sessions held.
func (c *Client) Len() int { return c.sess.Len() }

// Close closes every session.
func (c *Client) Close() { _ = c.sess.CloseAll((*yamux.Session).Close) }

// StreamWindow is the stream window of StreamPair's sessions: the
// backend's default (backends/yamux.DefaultMaxStreamWindow), so a raw leg
// and a backend leg are compared with the same windows.
const StreamWindow = 16 << 20

// Pair is one raw TLS 1.3 + hashicorp/yamux connection on loopback with one
// open stream: the baseline leg of the relay's CPU benchmark (relay,
// BenchmarkRelayCPU). Client writes, Server reads (both directions work).
type Pair struct {
	Client, Server io.ReadWriteCloser
	sessions       [2]*yamux.Session
}

// Close closes both sessions.
func (p *Pair) Close() error {
	return errors.Join(p.sessions[0].Close(), p.sessions[1].Close())
}

// StreamPair connects a client with clientConf to a server with
// serverConf over 127.0.0.1 (yamux DefaultConfig but StreamWindow, logs
// discarded) and opens one stream, bounded by ctx.
func StreamPair(ctx context.Context, serverConf, clientConf *tls.Config) (*Pair, error) {
	return StreamPairWindow(ctx, serverConf, clientConf, StreamWindow)
}

// StreamPairWindow is StreamPair with a stream window of window bytes (at
// least yamux's 256 KiB), e.g. the relay's agent-facing window.
func StreamPairWindow(ctx context.Context, serverConf, clientConf *tls.Config, window uint32) (*Pair, error) {
	sconf, cconf := rawkit.TLS(serverConf), rawkit.TLS(clientConf)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", sconf)
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	ycfg := yamux.DefaultConfig()
	ycfg.MaxStreamWindowSize = window
	ycfg.LogOutput = io.Discard
	type res struct {
		s   *yamux.Session
		st  *yamux.Stream
		err error
	}
	ch := make(chan res, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			ch <- res{err: err}
			return
		}
		if err := nc.(*tls.Conn).HandshakeContext(ctx); err != nil {
			_ = nc.Close()
			ch <- res{err: err}
			return
		}
		s, err := yamux.Server(nc, ycfg)
		if err != nil {
			_ = nc.Close()
			ch <- res{err: err}
			return
		}
		st, err := s.AcceptStreamWithContext(ctx)
		if err != nil {
			_ = s.Close()
		}
		ch <- res{s, st, err}
	}()
	d := tls.Dialer{Config: cconf}
	nc, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		_ = ln.Close()
		<-ch
		return nil, err
	}
	cs, err := yamux.Client(nc, ycfg)
	if err != nil {
		_ = nc.Close()
		_ = ln.Close()
		<-ch
		return nil, err
	}
	st, err := cs.OpenStream()
	if err == nil {
		_, err = st.Write([]byte{0}) // yamux announces a stream with its first frame
	}
	if err != nil {
		_ = cs.Close()
		_ = ln.Close()
		<-ch
		return nil, err
	}
	r := <-ch
	if r.err != nil {
		_ = cs.Close()
		return nil, r.err
	}
	var b [1]byte
	if _, err := io.ReadFull(r.st, b[:]); err != nil {
		_ = cs.Close()
		_ = r.s.Close()
		return nil, err
	}
	return &Pair{Client: st, Server: r.st, sessions: [2]*yamux.Session{cs, r.s}}, nil
}
