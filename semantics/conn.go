package semantics

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/wire"
)

// Config configures a Conn. The zero value is valid: default Limits, no
// logging, default scheduler settings. NewConn validates and copies it.
type Config struct {
	// Limits bounds streams and frames; zero fields take their defaults.
	Limits Limits
	// Logger receives connection-level events (refused and malformed
	// streams). nil discards them. Payloads are never logged.
	Logger *slog.Logger
	// BulkQueueThreshold is the BulkHinter.QueuedBytes level (bytes) above
	// which bulk writes wait; 0 means DefaultBulkQueueThreshold, negative
	// disables the check.
	BulkQueueThreshold int
	// BulkMaxWait bounds how long one bulk chunk waits for higher-priority
	// traffic; 0 means DefaultBulkMaxWait.
	BulkMaxWait time.Duration
	// Metrics, when set, receives the connection's stream counts and bytes
	// by stream kind (forgeyard_transport_streams_active,
	// forgeyard_transport_bytes_{in,out}_total: frame bodies and raw bytes
	// read, everything written) and its scheduler's queued bytes
	// (forgeyard_transport_{control,log,cas}_queue_bytes), e.g. a
	// *telemetry.Metrics. Nil, or an interface holding a nil pointer,
	// disables them: no hook is called.
	Metrics Observer
	// SendCheck, when set, is asked before every envelope this side writes
	// on any stream of the connection (control, data-plane answers,
	// secrets): a non-nil error refuses the write (nothing is written) and
	// is returned, wrapped in *SendRefusedError, by WriteEnvelope. The
	// daemon uses it to allow only the message types its role table
	// registers as daemon-sendable for the peer's role (§98, §191–192).
	SendCheck SendChecker
}

// SendChecker decides, before each envelope is written, whether its type
// may be sent (Config.SendCheck).
type SendChecker interface {
	CheckSend(wire.MessageTypeId) error
}

// SendRefusedError is returned by WriteEnvelope when Config.SendCheck
// refused the message type. Nothing was written.
type SendRefusedError struct {
	Type wire.MessageTypeId
	Err  error
}

// Error names the refused type and the check's reason.
func (e *SendRefusedError) Error() string {
	return "semantics: sending message type " + e.Type.String() + " refused: " + e.Err.Error()
}

// Unwrap returns the check's error.
func (e *SendRefusedError) Unwrap() error { return e.Err }

var discardLogger = slog.New(slog.DiscardHandler)

// LimitError is returned by OpenStream and OpenUniStream when this side's
// own stream limit (the same Limits the peer enforces) stayed reached until
// ctx was done. Err is ctx's error.
type LimitError struct {
	Kind  StreamKind
	Limit int  // the limit that was reached
	Total bool // true: Limits.MaxStreams; false: MaxStreamsPerKind[Kind]
	Err   error
}

// Error names the limit (per kind or total), its value, the stream kind being opened and the context error that ended the wait.
func (e *LimitError) Error() string {
	which := "per-kind"
	if e.Total {
		which = "total"
	}
	return fmt.Sprintf("semantics: %s stream limit %d reached opening a %s stream: %v", which, e.Limit, e.Kind, e.Err)
}

// Unwrap returns the context error.
func (e *LimitError) Unwrap() error { return e.Err }

// ConnStats are a Conn's counters.
type ConnStats struct {
	// Refused counts incoming streams reset with StreamRefused.
	Refused int64
	// UnknownKind counts incoming streams reset with StreamUnknownKind.
	UnknownKind int64
	// ProtocolErrors counts incoming streams reset with
	// StreamProtocolError (malformed header, wrong direction, timeout).
	ProtocolErrors int64
	// OpenIncoming and OpenOutgoing are the streams currently holding a
	// slot, by kind.
	OpenIncoming, OpenOutgoing [wire.NumStreamKinds]int
	// Sched are the write scheduler's counters.
	Sched SchedStats
}

// Conn is a connection with Forgeyard semantics over any BackendConn: every
// stream starts with a StreamHeader naming its kind (§40), per-kind limits
// are enforced on both sides (§133, §275), writes go through the priority
// scheduler (§45–49, §132), and close codes behave the same on every
// backend (§102–103). All methods are safe for concurrent use.
//
// Incoming streams over a limit are reset with StreamRefused. Each refusal
// counts against Limits.MaxRefusals and each admitted stream forgives one;
// when the count exceeds MaxRefusals the connection is closed with
// wire.CloseLimitExceeded. Unknown kinds and malformed headers reset the
// stream only (§184) and are counted in Stats.
//
// An idle Conn costs no goroutine and no buffer: the peer's bidirectional
// streams are taken from the backend by a goroutine started by the first
// AcceptStream call, and its unidirectional streams by one started by the
// first AcceptUniStream call (plus one short goroutine per stream while its
// header arrives; with HandleStreams that goroutine goes on to serve the
// stream, and no goroutine waits in Accept). Once started, a loop runs
// until the connection closes, whether or not an Accept call is waiting,
// so limits, refusals and header checks apply to every later stream of
// that direction. Streams the peer
// opens in a direction this side has never accepted wait inside the
// backend, bounded by the backend's own incoming-stream limit (the peer's
// open then blocks or is refused, as the backend documents); they are not
// counted, checked or refused until the first Accept call of that
// direction. The owner must eventually call CloseWithCode (or the peer
// close the connection) to end the loops.
type Conn struct {
	bc    BackendConn
	lim   Limits
	log   *slog.Logger // without per-connection attributes; see logger
	sched *scheduler
	ctx   context.Context
	m     Observer // nil: no observer
	check SendChecker

	bidiOnce, uniOnce sync.Once // start the accept loops
	pushOnce          sync.Once // asks a StreamPusher backend (startIncoming)
	pushed            bool      // it pushes; set once under pushOnce
	acceptBidi        acceptQueue[*Stream]
	acceptUni         acceptQueue[*RecvStream]

	mu       sync.Mutex
	out      [wire.NumStreamKinds]int
	outTotal int
	outWake  chan struct{} // nil, or closed and cleared when an outgoing slot frees
	in       [wire.NumStreamKinds]int
	inTotal  int // admitted incoming streams plus streams still sending their header
	refusals int // decays by one per admitted stream

	refused, unknownKind, protoErrs atomic.Int64
}

// NewConn wraps bc. cfg is validated and copied; zero fields take defaults.
// On a configuration error bc is left untouched.
func NewConn(bc BackendConn, cfg Config) (*Conn, error) {
	if bc == nil {
		return nil, errors.New("semantics: NewConn with nil BackendConn")
	}
	if err := cfg.Limits.Validate(); err != nil {
		return nil, err
	}
	if cfg.BulkMaxWait < 0 {
		return nil, fmt.Errorf("semantics: Config.BulkMaxWait is negative (%v)", cfg.BulkMaxWait)
	}
	lim := cfg.Limits.WithDefaults()
	if h, ok := bc.(BulkChunkHinter); ok && cfg.Limits.BulkChunk == 0 {
		if n := h.PreferredBulkChunk(); n > 0 {
			lim.BulkChunk = n
		}
	}
	threshold := cmp.Or(cfg.BulkQueueThreshold, DefaultBulkQueueThreshold)
	maxWait := cmp.Or(cfg.BulkMaxWait, DefaultBulkMaxWait)
	log := cfg.Logger
	if log == nil {
		log = discardLogger
	}
	checkCredit(bc, lim, log)
	hinter, _ := bc.(BulkHinter)
	c := &Conn{
		bc:    bc,
		lim:   lim,
		log:   log,
		sched: newScheduler(hinter, threshold, maxWait),
		ctx:   bc.Context(),
	}
	if !IsNilObserver(cfg.SendCheck) { // a nil pointer in the interface checks nothing
		c.check = cfg.SendCheck
	}
	if !IsNilObserver(cfg.Metrics) {
		c.m = cfg.Metrics
		c.sched.m = cfg.Metrics
	}
	return c, nil
}

// bytesIn and bytesOut report n bytes of a stream of kind k to the
// observer, if any (n ≤ 0 is not reported). Small enough to inline, so a
// Conn without observer pays one nil check.
func (c *Conn) bytesIn(k StreamKind, n int) {
	if c.m != nil && n > 0 {
		c.m.BytesIn(k, n)
	}
}

func (c *Conn) bytesOut(k StreamKind, n int) {
	if c.m != nil && n > 0 {
		c.m.BytesOut(k, n)
	}
}

// logger returns the logger with the connection's attributes. It is built
// on use (rare events only), so an idle Conn does not hold it.
func (c *Conn) logger() *slog.Logger {
	return c.log.With("backend", c.bc.Backend(), "remote", c.bc.RemoteAddr().String())
}

// Limits returns the effective limits (defaults filled in).
func (c *Conn) Limits() Limits { return c.lim }

// Backend returns the backend's name ("quic", "yamux", "memory", ...).
func (c *Conn) Backend() string { return c.bc.Backend() }

// Context is cancelled when the connection closes, with its *ConnError as
// the cause.
func (c *Conn) Context() context.Context { return c.ctx }

// Done is closed when the connection closes.
func (c *Conn) Done() <-chan struct{} { return c.ctx.Done() }

// Err returns the *ConnError the connection closed with, or nil while it
// is open.
func (c *Conn) Err() error {
	if c.ctx.Err() == nil {
		return nil
	}
	return c.closeErr()
}

func (c *Conn) closeErr() error {
	cause := context.Cause(c.ctx)
	var ce *ConnError
	if errors.As(cause, &ce) {
		return ce
	}
	return &ConnError{Code: wire.CloseInternalError, Reason: fmt.Sprintf("backend closed without a close code: %v", cause)}
}

// LocalAddr returns the local address.
func (c *Conn) LocalAddr() net.Addr { return c.bc.LocalAddr() }

// RemoteAddr returns the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.bc.RemoteAddr() }

// ConnectionState returns the backend's TLS state.
func (c *Conn) ConnectionState() tls.ConnectionState { return c.bc.ConnectionState() }

// PeerCertificates returns the peer's verified chain, leaf first
// (VerifiedChains[0]), or the unverified PeerCertificates if no chain was
// verified, or nil. The slice is a copy; the certificates are shared.
func (c *Conn) PeerCertificates() []*x509.Certificate {
	st := c.bc.ConnectionState()
	if len(st.VerifiedChains) > 0 {
		return append([]*x509.Certificate(nil), st.VerifiedChains[0]...)
	}
	if len(st.PeerCertificates) > 0 {
		return append([]*x509.Certificate(nil), st.PeerCertificates...)
	}
	return nil
}

// Stats returns a snapshot of the connection's counters.
func (c *Conn) Stats() ConnStats {
	c.mu.Lock()
	st := ConnStats{OpenIncoming: c.in, OpenOutgoing: c.out}
	c.mu.Unlock()
	st.Refused = c.refused.Load()
	st.UnknownKind = c.unknownKind.Load()
	st.ProtocolErrors = c.protoErrs.Load()
	st.Sched = c.sched.snapshot()
	return st
}

// CloseWithCode closes the connection; the peer observes a *ConnError with
// the same code and reason (Remote=true), and every blocked call here
// returns one with Remote=false. Idempotent: later calls return nil and do
// not change the code.
func (c *Conn) CloseWithCode(code CloseCode, reason string) error {
	return c.bc.CloseWithCode(code, reason)
}

// KindAllowsBidi reports whether streams of kind k may be bidirectional.
// Control, heartbeat, diagnostic, device and signing streams are
// request/response (bidi only); log streams are uni only; CAS and secret
// streams may be either.
func KindAllowsBidi(k StreamKind) bool { return k.Valid() && k != wire.StreamLog }

// KindAllowsUni reports whether streams of kind k may be unidirectional.
func KindAllowsUni(k StreamKind) bool {
	switch k {
	case wire.StreamLog, wire.StreamCasUpload, wire.StreamCasDownload, wire.StreamSecret:
		return true
	}
	return false
}

// OpenStream opens a bidirectional stream of kind and sends its header. It
// does not wait for the peer. While this side already has its limit of
// open streams of kind (or in total) it waits for one to finish; if ctx
// ends first it returns a *LimitError. After the connection closed it
// returns the *ConnError.
func (c *Conn) OpenStream(ctx context.Context, kind StreamKind) (*Stream, error) {
	if !KindAllowsBidi(kind) {
		return nil, fmt.Errorf("semantics: %s streams cannot be bidirectional", kind)
	}
	raw, sl, err := openRaw(c, ctx, kind, c.bc.OpenStream)
	if err != nil {
		return nil, err
	}
	s := newStream(c, raw, kind, sl)
	if err := s.SendStream.writeHeader(); err != nil {
		raw.CancelRead(StreamCancelled)
		raw.CancelWrite(StreamCancelled)
		sl.release()
		return nil, c.connErr(err)
	}
	return s, nil
}

// OpenUniStream opens a unidirectional stream of kind; see OpenStream.
func (c *Conn) OpenUniStream(ctx context.Context, kind StreamKind) (*SendStream, error) {
	if !KindAllowsUni(kind) {
		return nil, fmt.Errorf("semantics: %s streams cannot be unidirectional", kind)
	}
	raw, sl, err := openRaw(c, ctx, kind, c.bc.OpenUniStream)
	if err != nil {
		return nil, err
	}
	s := newSendStream(c, raw, kind, sl)
	if err := s.writeHeader(); err != nil {
		raw.CancelWrite(StreamCancelled)
		sl.release()
		return nil, c.connErr(err)
	}
	return s, nil
}

// openRaw takes an outgoing slot for kind and opens a raw stream with open
// (the backend's OpenStream or OpenUniStream), giving the slot back if the
// open fails: the common start of OpenStream and OpenUniStream.
func openRaw[R any](c *Conn, ctx context.Context, kind StreamKind, open func(context.Context) (R, error)) (R, *slot, error) {
	sl, err := c.reserve(ctx, kind)
	if err != nil {
		var none R
		return none, nil, err
	}
	raw, err := open(ctx)
	if err != nil {
		sl.release()
		var none R
		return none, nil, c.connErr(err)
	}
	return raw, sl, nil
}

// connErr prefers the connection's close error once it is closed.
func (c *Conn) connErr(err error) error {
	if c.ctx.Err() != nil {
		return c.closeErr()
	}
	return err
}

// reserve takes an outgoing slot for kind, waiting while none is free.
func (c *Conn) reserve(ctx context.Context, kind StreamKind) (*slot, error) {
	c.mu.Lock()
	for {
		if c.ctx.Err() != nil {
			c.mu.Unlock()
			return nil, c.closeErr()
		}
		perKind := c.out[kind] < c.lim.MaxStreamsPerKind[kind]
		total := c.outTotal < c.lim.MaxStreams
		if perKind && total {
			break
		}
		if err := ctx.Err(); err != nil {
			c.mu.Unlock()
			le := &LimitError{Kind: kind, Limit: c.lim.MaxStreamsPerKind[kind], Err: err}
			if !total {
				le.Total, le.Limit = true, c.lim.MaxStreams
			}
			return nil, le
		}
		if c.outWake == nil {
			c.outWake = make(chan struct{})
		}
		ch := c.outWake
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		case <-c.ctx.Done():
		}
		c.mu.Lock()
	}
	c.out[kind]++
	c.outTotal++
	c.mu.Unlock()
	if c.m != nil {
		c.m.StreamOpened(kind)
	}
	return &slot{c: c, kind: kind}, nil
}

// slot is one stream's claim on a limit. It is released once, when every
// half of the stream is done.
type slot struct {
	c        *Conn
	kind     StreamKind
	incoming bool
	halves   atomic.Int32 // halves still open; set before the stream is shared
	once     sync.Once
}

func (s *slot) halfDone() {
	if s.halves.Add(-1) == 0 {
		s.release()
	}
}

func (s *slot) release() {
	s.once.Do(func() {
		c := s.c
		c.mu.Lock()
		if s.incoming {
			c.in[s.kind]--
			c.inTotal--
		} else {
			c.out[s.kind]--
			c.outTotal--
			if c.outWake != nil {
				close(c.outWake)
				c.outWake = nil
			}
		}
		c.mu.Unlock()
		if c.m != nil {
			c.m.StreamClosed(s.kind)
		}
	})
}

// AcceptStream waits for the peer's next bidirectional stream whose header
// was valid and which fit the limits. It returns ctx's error, after the
// connection closed its *ConnError, and after HandleStreams
// ErrStreamsHandled. The first call starts taking the
// peer's bidirectional streams from the backend (see Conn).
func (c *Conn) AcceptStream(ctx context.Context) (*Stream, error) {
	c.startIncoming(false)
	return c.acceptBidi.take(ctx, c)
}

// AcceptUniStream waits for the peer's next unidirectional stream; see
// AcceptStream. The first call starts taking the peer's unidirectional
// streams from the backend.
func (c *Conn) AcceptUniStream(ctx context.Context) (*RecvStream, error) {
	c.startIncoming(true)
	return c.acceptUni.take(ctx, c)
}

// HandleStreams hands every bidirectional stream the peer opens to
// handle, on the goroutine that read the stream's header, instead of
// queueing it for AcceptStream: a server that serves each stream on a
// goroutine of its own then needs no goroutine waiting in AcceptStream for
// the next one, so an idle connection costs one goroutine less (limits,
// refusals and header checks are the same). Streams already queued are
// handed over at once, each on a goroutine of its own. handle may be
// called concurrently and may block for as long as it serves the stream.
// After the call AcceptStream returns ErrStreamsHandled; a second call
// replaces the handler for later streams.
func (c *Conn) HandleStreams(handle func(*Stream)) {
	c.acceptBidi.setHandler(handle)
	c.startIncoming(false)
}

// HandleUniStreams is HandleStreams for the peer's unidirectional streams;
// after it AcceptUniStream returns ErrStreamsHandled.
func (c *Conn) HandleUniStreams(handle func(*RecvStream)) {
	c.acceptUni.setHandler(handle)
	c.startIncoming(true)
}

// ErrStreamsHandled is returned by AcceptStream and AcceptUniStream once
// HandleStreams or HandleUniStreams took that direction's streams.
var ErrStreamsHandled = errors.New("semantics: the connection's incoming streams go to its stream handler")

// acceptQueue holds admitted streams until Accept takes them, or hands
// them to its handler. At most Limits.MaxStreams are queued (each holds a
// slot), so push never blocks; the slice is released whenever the queue
// empties, so an idle connection holds no buffer.
type acceptQueue[T any] struct {
	mu     sync.Mutex
	items  []T
	wake   chan struct{} // nil, or closed and cleared by push
	handle func(T)       // nil: queue for take
}

// setHandler makes h the receiver of every later push and hands it the
// queued items; a waiting take returns ErrStreamsHandled.
func (q *acceptQueue[T]) setHandler(h func(T)) {
	q.mu.Lock()
	items := q.items
	q.items = nil
	q.handle = h
	if q.wake != nil {
		close(q.wake)
		q.wake = nil
	}
	q.mu.Unlock()
	for _, v := range items {
		go h(v)
	}
}

func (q *acceptQueue[T]) push(v T) {
	q.mu.Lock()
	if h := q.handle; h != nil {
		q.mu.Unlock()
		h(v)
		return
	}
	q.items = append(q.items, v)
	if q.wake != nil {
		close(q.wake)
		q.wake = nil
	}
	q.mu.Unlock()
}

// take returns the oldest queued stream, waiting for one until ctx is done
// or the connection closes.
func (q *acceptQueue[T]) take(ctx context.Context, c *Conn) (T, error) {
	var zero T
	for {
		if c.ctx.Err() != nil {
			return zero, c.closeErr()
		}
		q.mu.Lock()
		if q.handle != nil {
			q.mu.Unlock()
			return zero, ErrStreamsHandled
		}
		if len(q.items) > 0 {
			v := q.items[0]
			q.items[0] = zero
			q.items = q.items[1:]
			if len(q.items) == 0 {
				q.items = nil
			}
			q.mu.Unlock()
			return v, nil
		}
		if q.wake == nil {
			q.wake = make(chan struct{})
		}
		ch := q.wake
		q.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return zero, ctx.Err()
		case <-c.ctx.Done():
			return zero, c.closeErr()
		}
	}
}

// acceptLoop accepts raw streams until the connection closes.
// startIncoming starts taking the peer's streams of one direction from
// the backend: both at once from a StreamPusher, else that direction's
// accept loop.
func (c *Conn) startIncoming(uni bool) {
	if p, ok := c.bc.(StreamPusher); ok {
		c.pushOnce.Do(func() {
			c.pushed = p.PushStreams(func(s RawStream) { c.incoming(s, s) }, func(s RawRecvStream) { c.incoming(s, nil) })
		})
		if c.pushed {
			return
		}
	}
	if uni {
		c.uniOnce.Do(func() { go c.acceptLoop(true) })
	} else {
		c.bidiOnce.Do(func() { go c.acceptLoop(false) })
	}
}

// incoming takes one stream the peer opened (bidi nil for a
// unidirectional one): over the total limit it is refused, else its
// header is read and checked on a goroutine of its own (admit).
func (c *Conn) incoming(rs RawRecvStream, bidi RawStream) {
	if c.ctx.Err() != nil { // closed: pushed by a backend still shutting down
		resetRaw(rs, bidi, StreamShutdown)
		return
	}
	c.mu.Lock()
	if c.inTotal >= c.lim.MaxStreams {
		c.mu.Unlock()
		c.refuse(rs, bidi, "total stream limit")
		return
	}
	c.inTotal++ // held while the header arrives
	c.mu.Unlock()
	go c.admit(rs, bidi)
}

func (c *Conn) acceptLoop(uni bool) {
	for {
		var rs RawRecvStream
		var bidi RawStream
		var err error
		if uni {
			rs, err = c.bc.AcceptUniStream(c.ctx)
		} else {
			bidi, err = c.bc.AcceptStream(c.ctx)
			rs = bidi
		}
		if err != nil {
			if c.ctx.Err() == nil {
				// A backend must only fail Accept when closed; anything
				// else leaves the connection unusable.
				_ = c.bc.CloseWithCode(wire.CloseInternalError, "accept failed")
			}
			return
		}
		c.incoming(rs, bidi)
	}
}

// resetRaw resets both directions of an incoming stream with code.
func resetRaw(rs RawRecvStream, bidi RawStream, code StreamErrorCode) {
	rs.CancelRead(code)
	if bidi != nil {
		bidi.CancelWrite(code)
	}
}

// refuse resets a stream over a limit and closes the connection once the
// peer persists (more than Limits.MaxRefusals refusals not offset by
// admitted streams).
func (c *Conn) refuse(rs RawRecvStream, bidi RawStream, why string) {
	c.refused.Add(1) // count before the peer can observe the reset
	c.mu.Lock()
	c.refusals++
	over := c.refusals > c.lim.MaxRefusals
	c.mu.Unlock()
	resetRaw(rs, bidi, StreamRefused)
	c.logger().Debug("refused incoming stream", "why", why)
	if over {
		c.logger().Warn("peer keeps exceeding stream limits; closing", "max_refusals", c.lim.MaxRefusals)
		_ = c.bc.CloseWithCode(wire.CloseLimitExceeded, "stream limit exceeded repeatedly")
	}
}

// admit reads an incoming stream's header (bounded by HeaderTimeout),
// checks kind, direction and limits, and queues the stream for Accept. It
// holds one unit of inTotal on entry.
func (c *Conn) admit(rs RawRecvStream, bidi RawStream) {
	fr := wire.NewFrameReader(rs, wire.MaxStreamHeaderFrame)
	_ = rs.SetReadDeadline(time.Now().Add(c.lim.HeaderTimeout))
	body, err := fr.Next()
	_ = rs.SetReadDeadline(time.Time{})
	var hdr wire.StreamHeader
	code := StreamErrorCode(0)
	why := ""
	switch {
	case err != nil:
		var se *StreamError
		if c.ctx.Err() != nil {
			code, why = StreamCancelled, "connection closed"
		} else if errors.As(err, &se) {
			code, why = StreamCancelled, "reset by the peer before its header"
		} else {
			code, why = StreamProtocolError, "header: "+err.Error()
		}
	default:
		hdr, err = wire.ParseStreamHeader(body)
		if err != nil {
			if k, ok := leadingKind(body); ok && !k.Valid() {
				code, why = StreamUnknownKind, fmt.Sprintf("unknown stream kind %d", k)
			} else {
				code, why = StreamProtocolError, "malformed header: "+err.Error()
			}
		} else if bidi != nil && !KindAllowsBidi(hdr.Kind) || bidi == nil && !KindAllowsUni(hdr.Kind) {
			code, why = StreamProtocolError, fmt.Sprintf("%s stream in the wrong direction", hdr.Kind)
		}
	}
	if why == "" && c.ctx.Err() != nil {
		// Closing (e.g. after persistent refusals): a backend may still
		// deliver streams the peer opened before it saw the close; they
		// are cancelled, not counted as refusals or admitted.
		code, why = StreamCancelled, "connection closed"
	}
	if why != "" {
		c.mu.Lock()
		c.inTotal--
		c.mu.Unlock()
		switch code { // count before the peer can observe the reset
		case StreamUnknownKind:
			c.unknownKind.Add(1)
		case StreamProtocolError:
			c.protoErrs.Add(1)
		}
		resetRaw(rs, bidi, code)
		if code != StreamCancelled {
			c.logger().Debug("dropped incoming stream", "why", why)
		}
		return
	}
	c.mu.Lock()
	if c.in[hdr.Kind] >= c.lim.MaxStreamsPerKind[hdr.Kind] {
		c.inTotal--
		c.mu.Unlock()
		c.refuse(rs, bidi, hdr.Kind.String()+" stream limit")
		return
	}
	c.in[hdr.Kind]++
	if c.refusals > 0 {
		c.refusals--
	}
	c.mu.Unlock()
	if c.m != nil {
		c.m.StreamOpened(hdr.Kind)
	}
	sl := &slot{c: c, kind: hdr.Kind, incoming: true}
	fr.SetLimit(c.lim.MaxFrame[hdr.Kind])
	if c.ctx.Err() != nil {
		resetRaw(rs, bidi, StreamCancelled)
		sl.release()
		return
	}
	if bidi != nil {
		c.acceptBidi.push(newAcceptedStream(c, bidi, hdr, fr, sl))
		return
	}
	c.acceptUni.push(newRecvStream(c, rs, hdr, fr, sl))
}

// leadingKind decodes the kind discriminant at the start of a header body.
func leadingKind(body []byte) (StreamKind, bool) {
	var v uint64
	for i := 0; i < len(body) && i < 5; i++ {
		v |= uint64(body[i]&0x7f) << (7 * i)
		if body[i] < 0x80 {
			if v > 255 {
				return 255, true
			}
			return StreamKind(v), true
		}
	}
	return 0, false
}

// creditWarned holds the (backend, credit, MaxStreams) already warned of.
var creditWarned sync.Map

// checkCredit warns when bc's stream credit (StreamCreditor) is below
// lim.MaxStreams, once per backend and values.
func checkCredit(bc BackendConn, lim Limits, log *slog.Logger) {
	sc, ok := bc.(StreamCreditor)
	if !ok {
		return
	}
	credit := sc.IncomingStreamCredit()
	if credit >= lim.MaxStreams {
		return
	}
	key := struct {
		backend         string
		credit, streams int
	}{bc.Backend(), credit, lim.MaxStreams}
	if _, seen := creditWarned.LoadOrStore(key, true); seen {
		return
	}
	log.Warn("backend stream credit below Limits.MaxStreams: streams the limits admit will block; give the backend's Config the same Limits",
		"backend", bc.Backend(), "credit", credit, "max_streams", lim.MaxStreams, "want_credit", lim.StreamCredit())
}
