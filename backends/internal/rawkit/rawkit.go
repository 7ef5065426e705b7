// Package rawkit is the library-independent half of the raw baselines
// (backends/quic/rawbench and backends/quic/wanraw over quic-go,
// backends/yamux/rawbench and backends/yamux/wanraw over TLS+yamux): the
// TLS configuration both sides offer, the accept loop, the one-byte echo
// that marks a connection as held, and the parallel dialling with retries.
// Each baseline keeps its own package for the library calls, since only
// backends/quic, backends/webtransport and backends/yamux may import their
// libraries (internal/testkit/deptest). Nothing in the product uses it.
package rawkit

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// ALPN is the protocol both sides offer (the product's, so TLS does the
// same work).
const ALPN = "forgeyard/1"

// TLS returns a clone of conf that offers only ALPN.
func TLS(conf *tls.Config) *tls.Config {
	tc := conf.Clone()
	tc.NextProtos = []string{ALPN}
	return tc
}

// Held is the list of connections (or sessions) one side holds. It is safe
// for concurrent use.
type Held[C any] struct {
	mu   sync.Mutex
	list []C
}

// Add holds c.
func (h *Held[C]) Add(c C) {
	h.mu.Lock()
	h.list = append(h.list, c)
	h.mu.Unlock()
}

// Len is the number held.
func (h *Held[C]) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.list)
}

// All returns a copy of the list held.
func (h *Held[C]) All() []C {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]C(nil), h.list...)
}

// CloseAll closes every one held with closeOne and forgets them; it
// returns their errors joined.
func (h *Held[C]) CloseAll(closeOne func(C) error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var errs []error
	for _, c := range h.list {
		errs = append(errs, closeOne(c))
	}
	h.list = nil
	return errors.Join(errs...)
}

// Server is what a raw baseline server keeps: the connections it holds,
// how many of them delivered their byte, and their streams (left open and
// unread until EchoAll).
type Server[C any] struct {
	Conns   Held[C]
	streams Held[io.ReadWriter]
	held    atomic.Int64
}

// Held is the number of connections whose stream delivered its byte.
func (s *Server[C]) Held() int64 { return s.held.Load() }

// Echo runs Echo on st and counts the connection as held if the echo was
// written; st is kept (no goroutine reads it) for EchoAll.
func (s *Server[C]) Echo(st io.ReadWriter) {
	if Echo(st) {
		s.streams.Add(st)
		s.held.Add(1)
	}
}

// EchoAll starts, on every held stream, a goroutine that writes back what
// it reads until the stream fails: the server's side of the steady echo
// (StartEcho), started after the idle connections were measured.
func (s *Server[C]) EchoAll() {
	s.streams.mu.Lock()
	defer s.streams.mu.Unlock()
	for _, st := range s.streams.list {
		go func() {
			var b [512]byte
			for {
				n, err := st.Read(b[:])
				if err != nil {
					return
				}
				if _, err := st.Write(b[:n]); err != nil {
					return
				}
			}
		}()
	}
}

// Client is what a raw baseline client keeps beside its connections: the
// stream each connection pinged on and the handshakes it began. A rawbench
// Client embeds it for StartEcho and Dials.
type Client struct {
	Streams Held[Stream]
	dials   atomic.Int64
}

// StartEcho starts the client's side of the steady echo on the stream
// each held connection pinged on (StartEcho); the server must have
// started its side (Server.EchoAll).
func (c *Client) StartEcho(ctx context.Context, interval time.Duration, size int, window time.Duration) *EchoRun {
	return StartEcho(ctx, c.Streams.All(), interval, size, window)
}

// Dials is the number of handshakes the client began (retries included).
func (c *Client) Dials() int64 { return c.dials.Load() }

// Dialed counts one handshake begun.
func (c *Client) Dialed() { c.dials.Add(1) }

// EchoRun is a running steady echo (StartEcho).
type EchoRun struct {
	done  atomic.Int64
	first atomic.Pointer[error]
	wg    sync.WaitGroup
	stop  context.CancelFunc
}

// StartEcho is the client's side of the steady echo: every stream writes
// size bytes and reads them back once per interval, the streams spread
// evenly over the interval (as a fleet's heartbeats are), until window has
// passed or ctx ends. A failed echo ends that stream's loop.
func StartEcho(ctx context.Context, streams []Stream, interval time.Duration, size int, window time.Duration) *EchoRun {
	ctx, cancel := context.WithTimeout(ctx, window)
	e := &EchoRun{stop: cancel}
	for i, st := range streams {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			t := time.NewTimer(interval * time.Duration(i) / time.Duration(len(streams)))
			defer t.Stop()
			out, in := make([]byte, size), make([]byte, size)
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				t.Reset(interval)
				_ = st.SetDeadline(time.Now().Add(interval))
				_, err := st.Write(out)
				if err == nil {
					_, err = io.ReadFull(st, in)
				}
				if err != nil {
					if ctx.Err() == nil {
						err := fmt.Errorf("rawkit: echo on stream %d: %w", i, err)
						e.first.CompareAndSwap(nil, &err)
					}
					return
				}
				e.done.Add(1)
			}
		}()
	}
	return e
}

// Count is the number of echoes completed so far.
func (e *EchoRun) Count() int64 { return e.done.Load() }

// Wait waits for the window to end and returns the first failed echo.
func (e *EchoRun) Wait() error {
	e.wg.Wait()
	e.stop()
	if err := e.first.Load(); err != nil {
		return *err
	}
	return nil
}

// Serve calls accept until ctx ends (it then closes ln, which makes accept
// fail, and returns nil) or accept fails (it returns that error), and hands
// every accepted connection to handle, which must not block.
func Serve[C any](ctx context.Context, ln io.Closer, accept func(context.Context) (C, error), handle func(C)) error {
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	for {
		c, err := accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		handle(c)
	}
}

// Echo is the server's side of a held connection's stream: it reads the
// one byte the client wrote and writes it back, and reports whether the
// echo was written (the echo tells the client it is held).
func Echo(st io.ReadWriter) bool {
	var b [1]byte
	if _, err := st.Read(b[:]); err != nil {
		return false
	}
	_, err := st.Write(b[:])
	return err == nil
}

// Stream is what Ping needs of a library's stream.
type Stream interface {
	io.ReadWriter
	SetDeadline(time.Time) error
}

// Ping is the client's side: it writes one byte on st and reads the
// server's echo, bounded by ctx's deadline.
func Ping(ctx context.Context, st Stream) error {
	if d, ok := ctx.Deadline(); ok {
		_ = st.SetDeadline(d)
	}
	if _, err := st.Write([]byte{1}); err != nil {
		return err
	}
	var b [1]byte
	_, err := st.Read(b[:])
	return err
}

// MaxTries bounds one connection's handshakes in DialN.
const MaxTries = 20

// DialN calls dial(i) for every i in [0, n), parallel at a time. A failed
// dial is tried again at once (up to MaxTries times, as a plain client
// does: a handshake the server's accept queue refused fails the echo, not
// the dial) unless ctx ended. After the first dial that failed for good
// DialN starts no more and returns its error, as "rawbench: <what> <i>:
// <err>", once the running ones finished.
func DialN(ctx context.Context, n, parallel int, what string, dial func(i int) error) error {
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
			for try := 0; try < MaxTries; try++ {
				if err = dial(i); err == nil || ctx.Err() != nil {
					break
				}
			}
			if err != nil {
				e := fmt.Errorf("rawbench: %s %d: %w", what, i, err)
				first.CompareAndSwap(nil, &e)
			}
		}()
	}
	wg.Wait()
	if e := first.Load(); e != nil {
		return *e
	}
	return nil
}
