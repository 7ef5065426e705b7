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
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
)

// ALPN is the protocol both sides offer (the product's).
const ALPN = "forgeyard/1"

// Server accepts raw sessions and holds them.
type Server struct {
	ln   net.Listener
	held atomic.Int64
	mu   sync.Mutex
	sess []*yamux.Session
}

// Listen listens on addr ("127.0.0.1:0") for TLS.
func Listen(addr string, conf *tls.Config) (*Server, error) {
	tc := conf.Clone()
	tc.NextProtos = []string{ALPN}
	ln, err := tls.Listen("tcp", addr, tc)
	if err != nil {
		return nil, err
	}
	return &Server{ln: ln}, nil
}

// Addr is the listening address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Held is the number of sessions whose stream delivered its byte.
func (s *Server) Held() int64 { return s.held.Load() }

// Serve accepts until ctx ends or the listener fails, then closes every
// session.
func (s *Server) Serve(ctx context.Context) error {
	defer func() {
		s.mu.Lock()
		for _, se := range s.sess {
			_ = se.Close()
		}
		s.mu.Unlock()
	}()
	stop := context.AfterFunc(ctx, func() { _ = s.ln.Close() })
	defer stop()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
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
			s.mu.Lock()
			s.sess = append(s.sess, se)
			s.mu.Unlock()
			st, err := se.AcceptStream()
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

// Client holds raw client sessions.
type Client struct {
	mu    sync.Mutex
	sess  []*yamux.Session
	dials atomic.Int64
}

// Dials is the number of handshakes the client began (retries included).
func (c *Client) Dials() int64 { return c.dials.Load() }

// maxTries bounds a session's handshakes in DialN.
const maxTries = 20

// DialN dials n sessions to addr, parallel at a time, from the loopback
// addresses 127.0.0.1 … 127.0.0.<sources>; conf(i) is session i's TLS
// configuration. It returns when every session's stream has written its
// byte was echoed by the server, or on the first error.
func DialN(ctx context.Context, addr string, n, parallel, sources int, conf func(i int) *tls.Config) (*Client, error) {
	sources = min(max(sources, 1), 254)
	c := &Client{}
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
			src := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+i%sources))}
			var err error
			for try := 0; try < maxTries; try++ { // at once, as a plain client does
				if err = c.dialOne(ctx, addr, src, conf(i)); err == nil || ctx.Err() != nil {
					break
				}
			}
			if err != nil {
				e := fmt.Errorf("rawbench: session %d: %w", i, err)
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

func (c *Client) dialOne(ctx context.Context, addr string, src *net.TCPAddr, conf *tls.Config) error {
	c.dials.Add(1)
	tc := conf.Clone()
	tc.NextProtos = []string{ALPN}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	d := tls.Dialer{NetDialer: &net.Dialer{LocalAddr: src}, Config: tc}
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
		if d, ok := ctx.Deadline(); ok {
			_ = st.SetDeadline(d)
		}
		if _, err = st.Write([]byte{1}); err == nil {
			var b [1]byte
			_, err = st.Read(b[:]) // the server's echo: it holds the session
		}
	}
	if err != nil {
		_ = se.Close()
		return err
	}
	c.mu.Lock()
	c.sess = append(c.sess, se)
	c.mu.Unlock()
	return nil
}

// Len is the number of sessions held.
func (c *Client) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sess)
}

// Close closes every session.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, se := range c.sess {
		errs = append(errs, se.Close())
	}
	_ = errors.Join(errs...)
	c.sess = nil
}

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
	sconf, cconf := serverConf.Clone(), clientConf.Clone()
	sconf.NextProtos, cconf.NextProtos = []string{ALPN}, []string{ALPN}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", sconf)
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	ycfg := yamux.DefaultConfig()
	ycfg.MaxStreamWindowSize = StreamWindow
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
