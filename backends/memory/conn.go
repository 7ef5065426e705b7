package memory

import (
	"context"
	"crypto/tls"
	"net"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// Options configures a connection pair. The zero value is a fast, lossless,
// unlimited in-process link with the default buffers.
type Options struct {
	// Latency delays the delivery of every write, FIN, reset, stream open
	// and close by this one-way duration. 0 means immediate delivery.
	Latency time.Duration
	// Bandwidth limits each direction to this many bytes per second; a
	// writer blocks while its bytes are "on the wire". 0 means unlimited.
	Bandwidth int64
	// SendBuffer, with Bandwidth, is how many bytes a direction accepts
	// beyond what it has transmitted before Write blocks, like a kernel
	// socket send buffer: every stream's data queues FIFO behind it. 0 means
	// a writer blocks until its own bytes are transmitted.
	SendBuffer int
	// CutAfterBytes cuts the connection once this many stream bytes (both
	// directions together) have been sent: the write that reaches the
	// limit delivers only the bytes up to it. 0 means never.
	CutAfterBytes int64
	// CutAfterWrites cuts the connection at the first Write call after
	// this many Write calls (both directions) succeeded. 0 means never.
	CutAfterWrites int64
	// StreamWindow is the per-stream, per-direction buffer in bytes: a
	// writer blocks when this many bytes are unread. 0 means
	// DefaultStreamWindow.
	StreamWindow int
	// Limits are the semantics.Limits the semantics.Conn over the pair
	// enforces (zero: the defaults); a zero MaxIncomingStreams is derived
	// from them.
	Limits semantics.Limits
	// MaxIncomingStreams bounds the open incoming streams per end and per
	// type (bidi, uni), as QUIC's MAX_STREAMS: OpenStream blocks at the
	// limit. 0 means the larger of DefaultMaxIncomingStreams and
	// Limits.StreamCredit() (MaxStreams + MaxRefusals).
	MaxIncomingStreams int
}

// Defaults for Options.
const (
	DefaultStreamWindow       = 256 << 10
	DefaultMaxIncomingStreams = 1000
)

// CutReason is the Reason of the *semantics.ConnError both ends see after a
// cut (Options.CutAfterBytes/CutAfterWrites or Conn.Disconnect).
const CutReason = "memory: network cut"

// ALPN is the application protocol the memory backend negotiates when a
// configuration names none.
const ALPN = "forgeyard/1"

func (o Options) withDefaults() Options {
	if o.StreamWindow <= 0 {
		o.StreamWindow = DefaultStreamWindow
	}
	if o.MaxIncomingStreams <= 0 {
		o.MaxIncomingStreams = max(DefaultMaxIncomingStreams, o.Limits.StreamCredit())
	}
	return o
}

// Addr is a memory network address.
type Addr struct{ Name string }

// Network returns "memory".
func (Addr) Network() string { return "memory" }

// String returns the name the listener was created with.
func (a Addr) String() string { return a.Name }

// Conn is one end of an in-process connection. It implements
// semantics.BackendConn and semantics.BulkHinter; all methods are safe for
// concurrent use.
type Conn struct {
	p    *pair
	side int // 0 client, 1 server
	out  *link

	local, remote net.Addr
	state         tls.ConnectionState

	ctx    context.Context
	cancel context.CancelCauseFunc

	// Guarded by p.mu.
	err      *semantics.ConnError
	acceptQ  [2][]*stream // incoming streams not yet accepted: [0] bidi, [1] uni
	acceptCh chan struct{}
	openIn   [2]int        // incoming streams open at this end, by type
	openCh   chan struct{} // signalled when openIn decreases
	streams  map[*stream]struct{}
	nextSID  uint64
}

var (
	_ semantics.BackendConn = (*Conn)(nil)
	_ semantics.BulkHinter  = (*Conn)(nil)
)

var pipeSeq atomic.Uint64

// Pipe returns a connected pair without TLS (ConnectionState is the zero
// value). Close both ends when done: with Latency or Bandwidth set, each
// direction has a delivery goroutine that ends when both ends are closed.
func Pipe(opts Options) (client, server *Conn) {
	n := pipeSeq.Add(1)
	return newPair(opts, Addr{Name: "pipe-client-" + itoa(n)}, Addr{Name: "pipe-server-" + itoa(n)},
		tls.ConnectionState{}, tls.ConnectionState{})
}

func newPair(opts Options, caddr, saddr net.Addr, cstate, sstate tls.ConnectionState) (client, server *Conn) {
	p := &pair{opts: opts.withDefaults(), done: make(chan struct{})}
	mk := func(side int, local, remote net.Addr, st tls.ConnectionState) *Conn {
		c := &Conn{p: p, side: side, local: local, remote: remote, state: st,
			acceptCh: make(chan struct{}), openCh: make(chan struct{}), streams: map[*stream]struct{}{}}
		c.ctx, c.cancel = context.WithCancelCause(context.Background())
		return c
	}
	p.ends[0] = mk(0, caddr, saddr, cstate)
	p.ends[1] = mk(1, saddr, caddr, sstate)
	p.links[0], p.links[1] = newLink(p), newLink(p)
	p.ends[0].out, p.ends[1].out = p.links[0], p.links[1]
	return p.ends[0], p.ends[1]
}

func (c *Conn) peer() *Conn { return c.p.ends[1-c.side] }

func signal(ch *chan struct{}) {
	close(*ch)
	*ch = make(chan struct{})
}

// OpenStream, OpenUniStream, AcceptStream and AcceptUniStream look alike
// but hand out different ends (the opener sends on ab, the accepter on
// ba); what they share is open and accept (and awaitLocked).
//
// OpenStream opens a bidirectional stream. The peer can accept it at once
// (after Latency), before any data is written. It blocks while the peer has
// MaxIncomingStreams bidirectional streams open, until ctx is done.
func (c *Conn) OpenStream(ctx context.Context) (semantics.RawStream, error) {
	s, err := c.open(ctx, 0)
	if err != nil {
		return nil, err
	}
	return &bidiEnd{sendEnd{s.ab, s}, recvEnd{s.ba, s}}, nil
}

// OpenUniStream opens a unidirectional stream; see OpenStream.
func (c *Conn) OpenUniStream(ctx context.Context) (semantics.RawSendStream, error) {
	s, err := c.open(ctx, 1)
	if err != nil {
		return nil, err
	}
	return &sendEnd{s.ab, s}, nil
}

func (c *Conn) open(ctx context.Context, typ int) (*stream, error) {
	p := c.p
	p.mu.Lock()
	defer p.mu.Unlock()
	peer := c.peer()
	err := c.awaitLocked(ctx, &peer.openCh, func() bool { return peer.openIn[typ] < p.opts.MaxIncomingStreams })
	if err != nil {
		return nil, err
	}
	peer.openIn[typ]++
	c.nextSID++
	s := newStream(c, peer, typ, c.nextSID)
	c.streams[s] = struct{}{}
	c.out.send(0, func() {
		if peer.err != nil {
			return
		}
		peer.streams[s] = struct{}{}
		peer.acceptQ[typ] = append(peer.acceptQ[typ], s)
		signal(&peer.acceptCh)
	})
	return s, nil
}

// AcceptStream waits for the peer's next bidirectional stream.
func (c *Conn) AcceptStream(ctx context.Context) (semantics.RawStream, error) {
	s, err := c.accept(ctx, 0)
	if err != nil {
		return nil, err
	}
	return &bidiEnd{sendEnd{s.ba, s}, recvEnd{s.ab, s}}, nil
}

// AcceptUniStream waits for the peer's next unidirectional stream.
func (c *Conn) AcceptUniStream(ctx context.Context) (semantics.RawRecvStream, error) {
	s, err := c.accept(ctx, 1)
	if err != nil {
		return nil, err
	}
	return &recvEnd{s.ab, s}, nil
}

func (c *Conn) accept(ctx context.Context, typ int) (*stream, error) {
	p := c.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := c.awaitLocked(ctx, &c.acceptCh, func() bool { return len(c.acceptQ[typ]) > 0 }); err != nil {
		return nil, err
	}
	q := c.acceptQ[typ]
	s := q[0]
	q[0] = nil
	c.acceptQ[typ] = q[1:]
	return s, nil
}

// awaitLocked waits, p.mu held, until ready reports true (nil), the
// connection failed (its error) or ctx ended (ctx.Err()), checked in that
// order; *ch is signalled whenever ready may have become true. open and
// accept share it.
func (c *Conn) awaitLocked(ctx context.Context, ch *chan struct{}, ready func() bool) error {
	for {
		if c.err != nil {
			return c.err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if ready() {
			return nil
		}
		c.p.waitLocked(*ch, time.Time{}, ctx.Done())
	}
}

// CloseWithCode closes the connection. Blocked calls at this end return a
// *semantics.ConnError{Code: code, Reason: reason, Remote: false}; the peer
// sees the same code and reason with Remote true (after Latency). Closing an
// already closed end does nothing and returns nil.
func (c *Conn) CloseWithCode(code semantics.CloseCode, reason string) error {
	p := c.p
	p.mu.Lock()
	defer p.mu.Unlock()
	reason = wire.TruncateUTF8(reason, wire.MaxCloseReason)
	if !c.closeLocked(&semantics.ConnError{Code: code, Reason: reason}) {
		return nil
	}
	peer := c.peer()
	c.out.send(0, func() {
		peer.closeLocked(&semantics.ConnError{Code: code, Reason: reason, Remote: true})
	})
	return nil
}

// closeLocked records err as this end's close error and wakes every waiter.
// It reports false if the end was already closed. Caller holds p.mu.
func (c *Conn) closeLocked(err *semantics.ConnError) bool {
	if c.err != nil {
		return false
	}
	c.err = err
	c.cancel(err)
	for s := range c.streams {
		s.wakeAll()
	}
	c.streams = nil
	c.acceptQ = [2][]*stream{}
	signal(&c.acceptCh)
	signal(&c.openCh)
	signal(&c.peer().openCh)
	c.p.markDone()
	return true
}

// Disconnect cuts the connection like a network failure: both ends fail at
// once with *semantics.ConnError{Code: wire.CloseIdleTimeout, Reason:
// CutReason, Remote: false}, and undelivered data is lost.
func (c *Conn) Disconnect() {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	c.p.cutLocked()
}

func (p *pair) cutLocked() {
	p.links[0].drop()
	p.links[1].drop()
	for _, e := range p.ends {
		e.closeLocked(&semantics.ConnError{Code: wire.CloseIdleTimeout, Reason: CutReason})
	}
}

// Context is cancelled when this end closes, with its *semantics.ConnError
// as the cause.
func (c *Conn) Context() context.Context { return c.ctx }

// LocalAddr returns this end's address.
func (c *Conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr returns the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// ConnectionState returns the TLS state established by the in-memory
// handshake (the zero value for Pipe).
func (c *Conn) ConnectionState() tls.ConnectionState { return c.state }

// Backend returns "memory".
func (c *Conn) Backend() string { return "memory" }

// IncomingStreamCredit implements semantics.StreamCreditor
// (Options.MaxIncomingStreams).
func (c *Conn) IncomingStreamCredit() int { return c.p.opts.MaxIncomingStreams }

// QueuedBytes returns the stream bytes this end sent that are still "on the
// wire" (delayed by Latency or Bandwidth).
func (c *Conn) QueuedBytes() int {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	return c.out.queued
}

func itoa(n uint64) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}
