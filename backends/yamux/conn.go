package yamux

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	hyamux "github.com/hashicorp/yamux"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

// Stream markers: the first byte of every yamux stream says what it is.
const (
	markerBidi    byte = 0x00
	markerUni     byte = 0x01
	markerControl byte = 0x02

	// readyByte is written by the listener over raw TLS once it accepted the
	// client (certificate verified). In TLS 1.3 the client's handshake
	// completes before the server has checked the client certificate; the
	// dialer waits for this byte so a rejected client fails in Dial.
	readyByte byte = 0x46
)

var (
	markerBidiB    = []byte{markerBidi}
	markerUniB     = []byte{markerUni}
	markerControlB = []byte{markerControl}
	pastDeadline   = time.Unix(1, 0)
)

// Control-stream records, Postcard enum:
//
//	enum ControlRecordV1 {
//	    Close(CloseFrameV1),                      // 0: the last record a side writes
//	    ResetStream { stream_id: u32, code: u32 }, // 1: the sender abandoned its send side
//	    StopSending { stream_id: u32, code: u32 }, // 2: the sender abandoned its receive side
//	    ResetAck { stream_id: u32 },               // 3: ResetStream recorded; FIN may follow
//	}
//
// Each record is one frame (varint length ‖ body) of at most maxCtrlFrame
// bytes.
const (
	recClose    = 0
	recReset    = 1
	recStop     = 2
	recResetAck = 3
	numRecords  = 4

	maxCtrlFrame = 512

	// maxPending bounds records kept for streams not (yet) registered, and
	// pendingTTL is how long one is kept.
	maxPending = 256
	pendingTTL = 10 * time.Second
)

// Conn is one TLS+yamux connection. It implements semantics.BackendConn and
// semantics.BulkHinter. All methods are safe for concurrent use.
type Conn struct {
	cfg    *Config // shared with the listener's other connections: read only
	log    *slog.Logger
	client bool
	sc     *sockConn
	sess   *hyamux.Session
	ctrl   *hyamux.Stream
	tc     *tls.Conn       // for ConnectionState (a copy per Conn cost 192 bytes)
	raw    syscall.RawConn // nil if not a TCP socket

	ctx    context.Context
	cancel context.CancelCauseFunc

	ctrlMu  sync.Mutex // serializes control-record writes
	ctrlBuf []byte

	mu       sync.Mutex
	local    *semantics.ConnError // CloseWithCode was called
	remote   *semantics.ConnError // the peer's close record
	failure  *semantics.ConnError // a local failure (write stall) that ended the session
	closeErr *semantics.ConnError // final error, set before done closes
	streams  map[uint32]*stream
	pending  map[uint32]*pendingRec
	incoming int
	// accepting is set once the accept loop was started, by the first
	// AcceptStream or AcceptUniStream call.
	accepting bool
	// pushBidi and pushUni receive the peer's streams once the owner asked
	// for them (PushStreams); nil: classify queues them for Accept.
	pushBidi func(semantics.RawStream)
	pushUni  func(semantics.RawRecvStream)

	bidi, uni streamQueue
	closing   chan struct{} // closed when CloseWithCode starts
	done      chan struct{} // closed once closeErr is set
	wg        sync.WaitGroup

	pingMu     sync.Mutex
	pingClosed bool
	pingWG     sync.WaitGroup
	pingTimer  *time.Timer
	pingEvery  time.Duration // pingMu; starts as cfg.KeepAliveInterval

	inYamux  atomic.Int64 // bytes inside yamux Stream.Write calls
	writeSeq atomic.Int64 // stream Write calls begun
	nse      notSentEstimate
}

type pendingRec struct {
	at       time.Time
	hasReset bool
	reset    semantics.StreamErrorCode
	hasStop  bool
	stop     semantics.StreamErrorCode
	ack      bool
}

var (
	_ semantics.BackendConn     = (*Conn)(nil)
	_ semantics.BulkHinter      = (*Conn)(nil)
	_ semantics.BackendListener = (*Listener)(nil)
	_ semantics.BackendDialer   = Dialer{}
	_ semantics.RawStream       = (*stream)(nil)
)

// sockConn is what yamux reads and writes: the TLS connection with an idle
// deadline on every read and a write deadline on every write.
type sockConn struct {
	net.Conn
	// bc is the batching layer below TLS (batch.go); nil when tests build
	// a Conn over another net.Conn. Only yamux's send loop writes to
	// sockConn, so holding is not guarded.
	bc           *batchConn
	holding      bool // a data header is in the open batch; its body follows
	idle, wto    time.Duration
	idleFired    atomic.Bool
	writeStalled atomic.Bool
	// rdl and wdl are the read and write deadlines set on Conn (UnixNano).
	// A read or write moves its deadline only when it is less than idle or
	// wto away: each is set idle+idle/64 (wto+wto/64) ahead, so a bulk
	// stream resets the socket's timers a few times a second, not for every
	// frame, and a read (write) still fails after between idle and
	// idle+idle/64 (wto and wto+wto/64) without progress.
	rdl, wdl int64
	// lastActive is when bytes last moved either way (UnixNano); lostIdle,
	// set by the first read that failed other than by the idle deadline
	// (EOF, reset: the peer or a box on the path dropped the connection),
	// is how long the socket had been silent then (ns, 0: not lost).
	lastActive atomic.Int64
	lostIdle   atomic.Int64
}

func (sc *sockConn) Read(p []byte) (int, error) {
	if t := time.Now().UnixNano() + int64(sc.idle); t > sc.rdl {
		sc.rdl = t + int64(sc.idle/deadlineSlack)
		_ = sc.Conn.SetReadDeadline(time.Unix(0, sc.rdl))
	}
	n, err := sc.Conn.Read(p)
	if n > 0 {
		sc.lastActive.Store(time.Now().UnixNano())
	}
	if err != nil {
		sc.noteReadErr(err)
	}
	return n, err
}

// Write writes one of yamux's writes. With a batching layer, a data
// frame's header stays in the open batch and leaves with its body in one
// write(2) (batch.go); the write deadline is set for the call that reaches
// the socket.
func (sc *sockConn) Write(p []byte) (int, error) {
	if sc.bc == nil {
		sc.armWrite()
		n, err := sc.Conn.Write(p)
		sc.wrote(n, err)
		return n, err
	}
	if !sc.holding && announcesBody(p) {
		sc.bc.begin()
		n, err := sc.Conn.Write(p) // into the batch: crypto/tls seals one record
		if err == nil {
			sc.holding = true
			return n, nil
		}
		_ = sc.bc.end()
		sc.wrote(n, err)
		return n, err
	}
	sc.holding = false
	sc.armWrite()
	sc.bc.begin()
	n, err := sc.Conn.Write(p)
	if ferr := sc.bc.end(); err == nil && ferr != nil {
		n, err = 0, ferr
	}
	sc.wrote(n, err)
	return n, err
}

// deadlineSlack divides idle and wto into the slack of a socket deadline.
const deadlineSlack = 64

// armWrite makes the write deadline at least wto from now.
func (sc *sockConn) armWrite() {
	if t := time.Now().UnixNano() + int64(sc.wto); t > sc.wdl {
		sc.wdl = t + int64(sc.wto/deadlineSlack)
		_ = sc.Conn.SetWriteDeadline(time.Unix(0, sc.wdl))
	}
}

func (sc *sockConn) wrote(n int, err error) {
	if n > 0 {
		sc.lastActive.Store(time.Now().UnixNano())
	}
	if err != nil {
		sc.noteWriteErr(err)
	}
}

// newConn starts yamux over an established TLS connection and sets up the
// control stream: the client opens it, the server accepts it (bounded by
// ctx). On error the TLS connection is closed.
// tc is what yamux runs over: tlsConn, or the HTTP/1.1 Upgrade wrapper of
// it; bc is the batching layer under tlsConn, or nil. cfg must not change
// afterwards.
func newConn(ctx context.Context, tc net.Conn, tlsConn *tls.Conn, bc *batchConn, raw syscall.RawConn, cfg *Config, client bool) (*Conn, error) {
	sc := &sockConn{Conn: tc, bc: bc, idle: cfg.IdleTimeout, wto: cfg.WriteTimeout}
	sc.lastActive.Store(time.Now().UnixNano())
	ycfg := cfg.yamuxConfig()
	var sess *hyamux.Session
	var err error
	if client {
		sess, err = hyamux.Client(sc, ycfg)
	} else {
		sess, err = hyamux.Server(sc, ycfg)
	}
	if err != nil {
		_ = tc.Close()
		return nil, handshakeError("yamux", err)
	}
	var ctrl *hyamux.Stream
	if client {
		ctrl, err = sess.OpenStream()
		if err == nil {
			_, err = ctrl.Write(markerControlB)
		}
	} else {
		ctrl, err = acceptControl(ctx, sess)
	}
	if err != nil {
		_ = sess.Close()
		return nil, handshakeError("control stream", err)
	}
	c := &Conn{
		cfg:     cfg,
		log:     cfg.Logger,
		client:  client,
		sc:      sc,
		sess:    sess,
		ctrl:    ctrl,
		tc:      tlsConn,
		raw:     raw,
		streams: make(map[uint32]*stream),
		pending: make(map[uint32]*pendingRec),
		bidi:    newStreamQueue(cfg.AcceptBacklog),
		uni:     newStreamQueue(cfg.AcceptBacklog),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
	}
	c.ctx, c.cancel = context.WithCancelCause(context.Background())
	c.pingMu.Lock() // orders the assignment before the first callback
	c.pingEvery = cfg.KeepAliveInterval
	c.pingTimer = time.AfterFunc(cfg.KeepAliveInterval, c.keepalive)
	c.pingMu.Unlock()
	c.wg.Add(1)
	go c.readControl()
	return c, nil
}

func acceptControl(ctx context.Context, sess *hyamux.Session) (*hyamux.Stream, error) {
	ys, err := sess.AcceptStreamWithContext(ctx)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = ys.SetReadDeadline(dl)
	}
	var b [1]byte
	if _, err := ys.Read(b[:]); err != nil {
		return nil, err
	}
	_ = ys.SetReadDeadline(time.Time{})
	if b[0] != markerControl {
		return nil, errors.New("first stream is not the control stream")
	}
	return ys, nil
}

// keepalive pings the peer so its idle deadline does not fire, then re-arms.
// It runs on the timer's goroutine; there is no goroutine per idle
// connection between pings.
func (c *Conn) keepalive() {
	c.pingMu.Lock()
	if c.pingClosed {
		c.pingMu.Unlock()
		return
	}
	c.pingWG.Add(1)
	c.pingMu.Unlock()
	defer c.pingWG.Done()
	_, _ = c.sess.Ping() // a missing answer is judged by the idle deadline
	c.pingMu.Lock()
	if !c.pingClosed {
		c.pingTimer.Reset(c.pingEvery)
	}
	c.pingMu.Unlock()
}

// SetKeepAliveInterval changes how often this connection pings its peer
// from now on (d > 0); the next ping is d from now. The peer's idle
// deadline is its own: a dialer that lengthens its interval beyond the
// listener's Config.IdleTimeout is cut by it, so callers stay at or below
// the interval the connection was dialled with.
func (c *Conn) SetKeepAliveInterval(d time.Duration) {
	if d <= 0 {
		return
	}
	c.pingMu.Lock()
	defer c.pingMu.Unlock()
	if c.pingClosed || c.pingEvery == d {
		return
	}
	c.pingEvery = d
	c.pingTimer.Reset(d)
}

// KeepAliveInterval is the connection's current ping interval.
func (c *Conn) KeepAliveInterval() time.Duration {
	c.pingMu.Lock()
	defer c.pingMu.Unlock()
	return c.pingEvery
}

func (c *Conn) stopKeepalive() {
	c.pingMu.Lock()
	c.pingClosed = true
	c.pingTimer.Stop()
	c.pingMu.Unlock()
	c.pingWG.Wait()
}

// readControl reads control records until the session ends, then records
// the connection's final error.
func (c *Conn) readControl() {
	defer c.wg.Done()
	c.readRecords()
	c.finalize()
}

// readRecords reads control records with plain Stream.Read calls into a
// buffer on the heap (64 bytes, grown to at most one largest frame) and
// returns at the end of the control stream, after a close record or after a
// protocol error. It used bufio and wire.FrameReader; their frames on this
// goroutine's stack while it waited grew the stack from 2 to 4 KiB, per
// connection (idle memory, issue 19 item 3).
func (c *Conn) readRecords() {
	buf := make([]byte, 0, 64)
	for {
		for len(buf) > 0 {
			body, n, ok := cutCtrlFrame(buf)
			if !ok {
				c.protocolError("malformed control frame")
				return
			}
			if n == 0 {
				break // incomplete: read more
			}
			if stop := c.handleRecord(body); stop {
				return
			}
			buf = buf[:copy(buf, buf[n:])]
		}
		if len(buf) == cap(buf) {
			nb := make([]byte, len(buf), min(2*cap(buf), maxCtrlFrame+ctrlPrefixMax))
			copy(nb, buf)
			buf = nb
		}
		m, err := c.ctrl.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		if err != nil && m == 0 {
			return // the session ended (a frame cut short ends with it)
		}
	}
}

// ctrlPrefixMax is the longest length prefix of a control frame: a varint
// of at most maxCtrlFrame takes two bytes.
const ctrlPrefixMax = 2

// cutCtrlFrame splits the first control frame (varint length ‖ body) off b:
// its body and total size, n 0 if b holds only part of it, ok false if the
// prefix is malformed or announces more than maxCtrlFrame bytes.
func cutCtrlFrame(b []byte) (body []byte, n int, ok bool) {
	var size, i int
	for ; ; i++ {
		if i == len(b) {
			return nil, 0, true
		}
		if i == ctrlPrefixMax {
			return nil, 0, false // a third prefix byte: over maxCtrlFrame
		}
		size |= int(b[i]&0x7f) << (7 * i)
		if b[i] < 0x80 {
			i++
			break
		}
	}
	if size > maxCtrlFrame {
		return nil, 0, false
	}
	if len(b) < i+size {
		return nil, 0, true
	}
	return b[i : i+size], i + size, true
}

// handleRecord applies one control record; it reports whether reading
// should stop (close record or protocol error).
func (c *Conn) handleRecord(body []byte) (stop bool) {
	d := postcard.NewDecoder(body)
	kind := d.Variant(numRecords)
	switch kind {
	case recClose:
		var f wire.CloseFrame
		f.DecodePostcard(&d)
		if d.Finish() != nil {
			c.protocolError("malformed close record")
			return true
		}
		c.mu.Lock()
		if c.remote == nil {
			c.remote = &semantics.ConnError{Code: f.Code, Reason: f.Reason, Remote: true}
		}
		c.mu.Unlock()
		_ = c.sess.Close()
		return true
	case recReset, recStop:
		id, code := d.U32(), semantics.StreamErrorCode(d.U32())
		if d.Finish() != nil {
			c.protocolError("malformed stream record")
			return true
		}
		s := c.lookup(id, func(p *pendingRec) {
			if kind == recReset {
				p.hasReset, p.reset = true, code
			} else {
				p.hasStop, p.stop = true, code
			}
		})
		if kind == recStop {
			if s != nil {
				s.remoteStop(code)
			}
			return false
		}
		if s != nil {
			s.remoteReset(code)
		}
		// The reset is recorded (on the stream or as pending): the peer may
		// now send its FIN without it being mistaken for a clean end.
		_ = c.writeRecord(c.cfg.WriteTimeout, func(b []byte) []byte {
			b = postcard.AppendVariant(b, recResetAck)
			return postcard.AppendU32(b, id)
		})
		return false
	case recResetAck:
		id := d.U32()
		if d.Finish() != nil {
			c.protocolError("malformed ack record")
			return true
		}
		if s := c.lookup(id, func(p *pendingRec) { p.ack = true }); s != nil {
			s.resetAcked()
		}
		return false
	}
	c.protocolError("unknown control record")
	return true
}

// protocolError ends the connection after a malformed control record.
func (c *Conn) protocolError(what string) {
	c.log.Warn("yamux: peer protocol error", "err", what)
	_ = c.closeLocal(wire.CloseProtocolError, what)
}

// writeRecord writes one control record, bounded by timeout.
func (c *Conn) writeRecord(timeout time.Duration, encode func([]byte) []byte) error {
	c.ctrlMu.Lock()
	defer c.ctrlMu.Unlock()
	b, err := wire.AppendFrame(c.ctrlBuf[:0], maxCtrlFrame, encode)
	if err != nil {
		return err
	}
	c.ctrlBuf = b
	_ = c.ctrl.SetWriteDeadline(time.Now().Add(timeout))
	_, err = c.ctrl.Write(b)
	return err
}

func (c *Conn) writeStreamRecord(kind uint32, id uint32, code semantics.StreamErrorCode) error {
	return c.writeRecord(c.cfg.WriteTimeout, func(b []byte) []byte {
		b = postcard.AppendVariant(b, kind)
		b = postcard.AppendU32(b, id)
		return postcard.AppendU32(b, uint32(code))
	})
}

// lookup returns the registered stream id, or records the update in the
// pending table (bounded, expiring) for a stream not registered yet.
func (c *Conn) lookup(id uint32, update func(*pendingRec)) *stream {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.streams[id]; s != nil {
		return s
	}
	p := c.pending[id]
	if p == nil {
		if len(c.pending) >= maxPending {
			now := time.Now()
			for k, v := range c.pending {
				if now.Sub(v.at) > pendingTTL {
					delete(c.pending, k)
				}
			}
		}
		if len(c.pending) >= maxPending {
			c.log.Debug("yamux: dropping control record for unknown stream", "stream", id)
			return nil
		}
		p = &pendingRec{at: time.Now()}
		c.pending[id] = p
	}
	update(p)
	return nil
}

// register makes s reachable by control records and applies any that
// arrived before it.
func (c *Conn) register(s *stream) {
	c.mu.Lock()
	c.streams[s.id] = s
	p := c.pending[s.id]
	delete(c.pending, s.id)
	c.mu.Unlock()
	if p == nil {
		return
	}
	if p.hasReset {
		s.remoteReset(p.reset)
	}
	if p.hasStop {
		s.remoteStop(p.stop)
	}
	if p.ack {
		s.resetAcked()
	}
}

func (c *Conn) unregister(s *stream) {
	c.mu.Lock()
	if c.streams[s.id] == s {
		delete(c.streams, s.id)
	}
	if s.counted {
		s.counted = false
		c.incoming--
	}
	c.mu.Unlock()
}

// IncomingStreamCredit implements semantics.StreamCreditor: the streams
// the peer may have open at once without a refusal by this backend, the
// smaller of AcceptBacklog and MaxIncomingStreams.
func (c *Conn) IncomingStreamCredit() int { return min(c.cfg.AcceptBacklog, c.cfg.MaxIncomingStreams) }

// startAccepting starts the accept loop on the first AcceptStream or
// AcceptUniStream call, so an idle connection whose owner never accepts
// runs no accept goroutine; until then the peer's streams wait in yamux's
// accept backlog (Config.AcceptBacklog; yamux resets streams beyond it).
func (c *Conn) startAccepting() {
	c.mu.Lock()
	defer c.mu.Unlock()
	// While neither is set, readControl holds a wg count (it sets closeErr
	// before it exits), so this Add cannot race with a finished Wait.
	if c.accepting || c.local != nil || c.closeErr != nil {
		return
	}
	c.accepting = true
	c.wg.Add(1)
	go c.acceptLoop()
}

// acceptLoop takes streams from yamux, applies the hard cap and hands them
// to a classifier that reads their marker.
func (c *Conn) acceptLoop() {
	defer c.wg.Done()
	for {
		ys, err := c.sess.AcceptStream()
		if err != nil {
			return
		}
		s := &stream{c: c, ys: ys, id: ys.StreamID(), incoming: true}
		c.mu.Lock()
		over := c.incoming >= c.cfg.MaxIncomingStreams
		flood := len(c.streams) >= 2*c.cfg.MaxIncomingStreams+c.cfg.AcceptBacklog
		if !over {
			c.incoming++
			s.counted = true
		}
		c.mu.Unlock()
		if flood {
			c.protocolError("too many streams")
			return
		}
		c.register(s)
		if over {
			s.refuse(true)
			continue
		}
		c.wg.Add(1)
		go c.classify(s)
	}
}

// classify reads an incoming stream's marker (bounded by HandshakeTimeout)
// and queues it for AcceptStream or AcceptUniStream; a full queue refuses
// it with StreamRefused.
func (c *Conn) classify(s *stream) {
	defer c.wg.Done()
	_ = s.ys.SetReadDeadline(time.Now().Add(c.cfg.HandshakeTimeout))
	var b [1]byte
	n, err := s.ys.Read(b[:])
	s.mu.Lock()
	if s.rerr == nil {
		_ = s.ys.SetReadDeadline(time.Time{})
	}
	s.mu.Unlock()
	if n == 0 || err != nil {
		if !c.sess.IsClosed() {
			s.refuseCode(semantics.StreamProtocolError, true)
		}
		return
	}
	var q *streamQueue
	switch b[0] {
	case markerBidi:
		q = &c.bidi
	case markerUni:
		q = &c.uni
		// Receive-only: our send side ends now (yamux needs both FINs to
		// free the stream).
		s.mu.Lock()
		s.wdone, s.finSent = true, true
		s.mu.Unlock()
		_ = s.ys.Close()
	default:
		s.refuseCode(semantics.StreamProtocolError, true)
		return
	}
	// Queued under c.mu, so that PushStreams (which drains the queues
	// under it) never leaves a stream behind.
	c.mu.Lock()
	pushBidi, pushUni := c.pushBidi, c.pushUni
	queued := pushBidi != nil || q.push(s)
	c.mu.Unlock()
	switch {
	case pushBidi != nil && q == &c.bidi:
		pushBidi(s)
	case pushUni != nil:
		pushUni(s)
	case !queued:
		s.refuse(b[0] == markerBidi)
	}
}

// PushStreams implements semantics.StreamPusher: the streams classify
// sorted by their marker go to bidi and uni (those queued already first)
// instead of waiting for AcceptStream and AcceptUniStream, so that the
// owner needs no goroutine per direction waiting for the next one.
func (c *Conn) PushStreams(bidi func(semantics.RawStream), uni func(semantics.RawRecvStream)) bool {
	c.mu.Lock()
	c.pushBidi, c.pushUni = bidi, uni
	var bs, us []*stream
	for s := c.bidi.pop(); s != nil; s = c.bidi.pop() {
		bs = append(bs, s)
	}
	for s := c.uni.pop(); s != nil; s = c.uni.pop() {
		us = append(us, s)
	}
	c.mu.Unlock()
	for _, s := range bs {
		bidi(s)
	}
	for _, s := range us {
		uni(s)
	}
	c.startAccepting()
	return true
}

// usable returns the error to report if the connection cannot start new
// work.
func (c *Conn) usable(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case <-c.closing:
		return c.connError()
	case <-c.done:
		return c.connError()
	default:
		return nil
	}
}

// OpenStream opens a bidirectional stream. yamux does not wait for the peer
// to accept: a peer over its stream limit refuses the stream, and the first
// Read or Write returns *semantics.StreamError{Code: StreamRefused}. ctx is
// checked before opening; the open itself is bounded by WriteTimeout.
func (c *Conn) OpenStream(ctx context.Context) (semantics.RawStream, error) {
	s, err := c.open(ctx, markerBidiB)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// OpenUniStream opens a unidirectional (send-only) stream, like OpenStream.
func (c *Conn) OpenUniStream(ctx context.Context) (semantics.RawSendStream, error) {
	s, err := c.open(ctx, markerUniB)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (c *Conn) open(ctx context.Context, marker []byte) (*stream, error) {
	if err := c.usable(ctx); err != nil {
		return nil, err
	}
	ys, err := c.sess.OpenStream()
	if err != nil {
		return nil, c.sessionError(err)
	}
	s := &stream{c: c, ys: ys, id: ys.StreamID()}
	if marker[0] == markerUni {
		s.rdone = true // we never read; the peer's FIN is handled by yamux
	}
	// Register before the marker is sent: the peer cannot refer to the
	// stream before it has read the marker.
	c.register(s)
	if _, err := ys.Write(marker); err != nil {
		err = c.streamError(s, err, false)
		var se *semantics.StreamError
		if errors.As(err, &se) {
			// Refused (or stopped) before the marker went out: the stream
			// exists and its first Read or Write reports the code.
			return s, nil
		}
		s.abandon()
		return nil, err
	}
	return s, nil
}

// AcceptStream waits for the peer's next bidirectional stream. The first
// AcceptStream or AcceptUniStream call starts taking the peer's streams
// from yamux (marker, hard cap, backlog); before it they wait in yamux's
// own accept backlog.
func (c *Conn) AcceptStream(ctx context.Context) (semantics.RawStream, error) {
	s, err := c.accept(ctx, &c.bidi)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// AcceptUniStream waits for the peer's next unidirectional stream.
func (c *Conn) AcceptUniStream(ctx context.Context) (semantics.RawRecvStream, error) {
	s, err := c.accept(ctx, &c.uni)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (c *Conn) accept(ctx context.Context, q *streamQueue) (*stream, error) {
	c.startAccepting()
	for {
		if err := c.usable(ctx); err != nil {
			return nil, err
		}
		if s := q.pop(); s != nil {
			return s, nil
		}
		select {
		case <-q.wait():
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.closing:
			return nil, c.connError()
		case <-c.done:
			return nil, c.connError()
		}
	}
}

// streamQueue holds accepted streams waiting for AcceptStream or
// AcceptUniStream, at most max of them. Its slice grows on demand, so an
// idle connection does not pay for the backlog.
type streamQueue struct {
	mu    sync.Mutex
	items []*stream
	max   int
	avail chan struct{} // holds a token while items is non-empty; made on first use
}

func newStreamQueue(max int) streamQueue {
	return streamQueue{max: max}
}

// availLocked returns the token channel, making it on first use (an idle
// connection whose owner never accepts holds none). Called with q.mu held.
func (q *streamQueue) availLocked() chan struct{} {
	if q.avail == nil {
		q.avail = make(chan struct{}, 1)
		if len(q.items) > 0 {
			q.avail <- struct{}{}
		}
	}
	return q.avail
}

// wait returns the channel that holds a token while streams are queued.
func (q *streamQueue) wait() <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.availLocked()
}

// push appends s; false means the queue is full.
func (q *streamQueue) push(s *stream) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) >= q.max {
		return false
	}
	q.items = append(q.items, s)
	select {
	case q.availLocked() <- struct{}{}:
	default:
	}
	return true
}

// pop removes the oldest stream, or returns nil.
func (q *streamQueue) pop() *stream {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return nil
	}
	s := q.items[0]
	q.items[0] = nil
	q.items = q.items[1:]
	if len(q.items) == 0 {
		q.items = nil
	} else {
		select { // pass the token on to the next waiter
		case q.availLocked() <- struct{}{}:
		default:
		}
	}
	return s
}

// CloseWithCode writes a close record with code and reason (truncated to
// wire.MaxCloseReason bytes) on the control stream, waits up to
// Config.CloseTimeout for it to be written and for the peer to drop the
// connection, then closes the session and waits for this connection's
// goroutines to exit. The peer reports *semantics.ConnError{Code, Reason,
// Remote: true}; local calls report the same with Remote false. Idempotent:
// later calls (and calls after the connection died) return nil.
func (c *Conn) CloseWithCode(code semantics.CloseCode, reason string) error {
	if !c.closeLocal(code, reason) {
		// Another close is in progress or done: wait for it, so the
		// first close record is not cut short.
		<-c.done
	}
	c.wg.Wait()
	return nil
}

// closeLocal is CloseWithCode without waiting for the connection's
// goroutines, so those goroutines can use it themselves. It reports false
// if the connection was already closing or closed.
func (c *Conn) closeLocal(code semantics.CloseCode, reason string) bool {
	reason = wire.TruncateUTF8(reason, wire.MaxCloseReason)
	c.mu.Lock()
	if c.local != nil || c.closeErr != nil {
		c.mu.Unlock()
		return false
	}
	c.local = &semantics.ConnError{Code: code, Reason: reason}
	close(c.closing)
	c.mu.Unlock()
	c.cancel(c.local) // the connection is closing: Context reports it now

	timer := time.NewTimer(c.cfg.CloseTimeout)
	defer timer.Stop()
	wrote := make(chan error, 1)
	go func() {
		wrote <- c.writeRecord(c.cfg.CloseTimeout, func(b []byte) []byte {
			b = postcard.AppendVariant(b, recClose)
			f := wire.CloseFrame{Code: code, Reason: reason}
			return f.AppendPostcard(b)
		})
	}()
	pending := true
	select {
	case err := <-wrote:
		pending = false
		if err == nil {
			// The record is in the socket; give the peer time to read it
			// and drop the connection, so it is not lost to an RST.
			select {
			case <-c.sess.CloseChan():
			case <-timer.C:
			}
		}
	case <-timer.C:
	}
	_ = c.sess.Close() // unblocks a stuck record write
	if pending {
		<-wrote
	}
	return true
}

// fail ends the connection locally after an unrecoverable failure, without
// a close record (the socket is presumed unusable).
func (c *Conn) fail(err *semantics.ConnError) {
	c.mu.Lock()
	if c.failure == nil {
		c.failure = err
	}
	c.mu.Unlock()
	go c.sess.Close()
}

// finalize records the final error once the session is gone. It runs on
// the control reader.
func (c *Conn) finalize() {
	_ = c.sess.Close()
	c.stopKeepalive()
	c.mu.Lock()
	err := c.local
	if err == nil {
		err = c.remote
	}
	if err == nil {
		err = c.failure
	}
	if err == nil {
		err = c.sc.classify()
	}
	c.closeErr = err
	c.mu.Unlock()
	c.cancel(err)
	close(c.done)
}

// connError returns the connection's close error, waiting (bounded) for
// the control reader to record it.
func (c *Conn) connError() error {
	c.mu.Lock()
	local := c.local
	c.mu.Unlock()
	if local != nil {
		return local
	}
	t := time.NewTimer(c.cfg.WriteTimeout + c.cfg.CloseTimeout)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
		// The control reader has not finished (a starved process): say
		// what is known already — the failure that ended the session
		// (a stalled write), else what the socket saw — rather than a
		// generic loss.
		c.mu.Lock()
		f := c.failure
		c.mu.Unlock()
		if f != nil {
			return f
		}
		return c.sc.classify()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeErr
}

// IdleAtLoss reports, for a connection that ended as "connection lost"
// (the socket hit EOF or a reset with no close record: the peer vanished,
// or a proxy or NAT on the path dropped the connection), how long no byte
// had moved either way when it was lost, and true; (0, false) while the
// connection is open or when it ended any other way. A proxy that cuts idle
// tunnels shows as losses at the same idle time again and again, shorter
// than Config.KeepAliveInterval: the dialing side can ping more often.
func (c *Conn) IdleAtLoss() (time.Duration, bool) {
	c.mu.Lock()
	lost := c.closeErr == errConnLost // set before Context is cancelled
	c.mu.Unlock()
	idle := time.Duration(c.sc.lostIdle.Load())
	if !lost || idle <= 0 {
		return 0, false
	}
	return idle, true
}

// Context is cancelled when the connection closes; context.Cause returns
// the *semantics.ConnError.
func (c *Conn) Context() context.Context { return c.ctx }

// LocalAddr returns the local TCP address.
func (c *Conn) LocalAddr() net.Addr { return c.sc.LocalAddr() }

// RemoteAddr returns the peer's TCP address.
func (c *Conn) RemoteAddr() net.Addr { return c.sc.RemoteAddr() }

// ConnectionState returns the TLS state captured after the handshake.
func (c *Conn) ConnectionState() tls.ConnectionState { return c.tc.ConnectionState() }

// PreferredBulkChunk returns BulkChunk: semantics.NewConn cuts bulk
// writes into chunks of that size unless its Limits set BulkChunk.
func (c *Conn) PreferredBulkChunk() int { return BulkChunk }

// Backend returns "yamux".
func (c *Conn) Backend() string { return "yamux" }

// QueuedBytes estimates bytes accepted by stream writes but not yet on the
// wire: bytes inside yamux's send path (Stream.Write returns only once its
// frame was written to the socket) plus the socket's unsent bytes
// (SIOCOUTQNSD, the figure of TCP_INFO's tcpi_notsent_bytes; 0 where
// unsupported) or, between two reads of it, an upper bound on them (the
// last read plus what the socket accepted since; queue.go), so most calls
// make no system call.
func (c *Conn) QueuedBytes() int {
	return int(c.inYamux.Load()) + c.notSent()
}
