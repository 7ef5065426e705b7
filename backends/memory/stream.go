package memory

import (
	"errors"
	"io"
	"os"
	"time"

	"forgeyard.dev/transport/semantics"
)

// ErrWriteClosed is returned by Write after Close on the same stream.
var ErrWriteClosed = errors.New("memory: write on closed stream")

// maxSegment bounds one delivery, so a large Write interleaves with others.
const maxSegment = 64 << 10

// stream is one stream of a pair. ab carries opener → acceptor; ba the
// reverse (nil for unidirectional streams). Guarded by pair.mu.
type stream struct {
	p                *pair
	id               uint64
	typ              int // 0 bidi, 1 uni
	opener, acceptor *Conn
	ab, ba           *half
	released         bool
}

func newStream(opener, acceptor *Conn, typ int, id uint64) *stream {
	s := &stream{p: opener.p, id: id, typ: typ, opener: opener, acceptor: acceptor}
	s.ab = newHalf(s, opener, acceptor)
	if typ == 0 {
		s.ba = newHalf(s, acceptor, opener)
	}
	return s
}

func (s *stream) wakeAll() {
	signal(&s.ab.wake)
	if s.ba != nil {
		signal(&s.ba.wake)
	}
}

// maybeRelease frees the acceptor's stream slot once every half finished.
func (s *stream) maybeRelease() {
	if s.released || !s.ab.terminal || (s.ba != nil && !s.ba.terminal) {
		return
	}
	s.released = true
	s.acceptor.openIn[s.typ]--
	signal(&s.acceptor.openCh)
	delete(s.opener.streams, s)
	delete(s.acceptor.streams, s)
}

// half is one direction of a stream: writer end w, reader end r.
type half struct {
	s    *stream
	w, r *Conn

	buf      []byte // delivered, unread: buf[off:]
	off      int
	inflight int // sent, not yet delivered
	window   int

	finSent, finRecv bool
	resetRecv        bool
	resetCode        semantics.StreamErrorCode
	wCancelled       bool
	wCode            semantics.StreamErrorCode
	stopRecv         bool
	stopCode         semantics.StreamErrorCode
	rCancelled       bool
	rCode            semantics.StreamErrorCode
	terminal         bool

	wake     chan struct{} // signalled on every state change
	rdl, wdl time.Time
}

func newHalf(s *stream, w, r *Conn) *half {
	return &half{s: s, w: w, r: r, window: s.p.opts.StreamWindow, wake: make(chan struct{})}
}

func (h *half) checkTerminal() {
	if !h.terminal && (h.finRecv || h.resetRecv || h.rCancelled) {
		h.terminal = true
		h.s.maybeRelease()
	}
}

func expired(dl time.Time) bool { return !dl.IsZero() && !time.Now().Before(dl) }

// deliver appends data for the reader. Caller holds pair.mu.
func (h *half) deliver(data []byte) {
	if h.r.err != nil || h.rCancelled || h.resetRecv {
		return
	}
	if h.off > 0 && len(h.buf)+len(data) > cap(h.buf) {
		n := copy(h.buf, h.buf[h.off:])
		h.buf = h.buf[:n]
		h.off = 0
	}
	h.buf = append(h.buf, data...)
	signal(&h.wake)
}

func (h *half) write(b []byte) (int, error) {
	p := h.s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	w := h.w
	if w.err == nil && p.opts.CutAfterWrites > 0 {
		if p.writes >= p.opts.CutAfterWrites {
			p.cutLocked()
		} else {
			p.writes++
		}
	}
	n := 0
	for {
		switch {
		case w.err != nil:
			return n, w.err
		case h.wCancelled:
			return n, &semantics.StreamError{Code: h.wCode}
		case h.stopRecv:
			return n, &semantics.StreamError{Code: h.stopCode, Remote: true}
		case h.finSent:
			return n, ErrWriteClosed
		case len(b) == 0:
			return n, nil
		case expired(h.wdl):
			return n, os.ErrDeadlineExceeded
		}
		credit := h.window - h.inflight - (len(h.buf) - h.off)
		if credit <= 0 {
			p.waitLocked(h.wake, h.wdl, nil)
			continue
		}
		k := min(credit, len(b), maxSegment)
		if limit := p.opts.CutAfterBytes; limit > 0 {
			left := limit - p.bytes
			if left <= 0 {
				p.cutLocked()
				continue
			}
			k = int(min(int64(k), left))
		}
		p.bytes += int64(k)
		chunk := b[:k]
		b = b[k:]
		n += k
		if w.out.delayed {
			chunk = append([]byte(nil), chunk...)
		}
		h.inflight += k
		tx := w.out.send(k, func() {
			h.inflight -= k
			h.deliver(chunk)
		})
		if p.opts.CutAfterBytes > 0 && p.bytes >= p.opts.CutAfterBytes {
			p.cutLocked()
			continue
		}
		if !tx.IsZero() {
			done := w.ctx.Done()
			p.mu.Unlock()
			sleepUntil(tx, done)
			p.mu.Lock()
		}
	}
}

func (h *half) read(b []byte) (int, error) {
	p := h.s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		switch {
		case h.r.err != nil:
			return 0, h.r.err
		case h.rCancelled:
			return 0, &semantics.StreamError{Code: h.rCode}
		case h.resetRecv:
			return 0, &semantics.StreamError{Code: h.resetCode, Remote: true}
		case len(h.buf) > h.off:
			n := copy(b, h.buf[h.off:])
			h.off += n
			if h.off == len(h.buf) {
				h.buf, h.off = h.buf[:0], 0
			}
			signal(&h.wake) // credit for the writer
			return n, nil
		case h.finRecv:
			return 0, io.EOF
		case len(b) == 0:
			return 0, nil
		case expired(h.rdl):
			return 0, os.ErrDeadlineExceeded
		}
		p.waitLocked(h.wake, h.rdl, nil)
	}
}

func (h *half) close() error {
	p := h.s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if h.w.err != nil || h.wCancelled || h.finSent {
		return nil
	}
	h.finSent = true
	signal(&h.wake)
	h.w.out.send(0, func() {
		if h.resetRecv {
			return
		}
		h.finRecv = true
		signal(&h.wake)
		h.checkTerminal()
	})
	return nil
}

// cancelWrite and cancelRead look alike but end opposite sides with other
// state (the writer's cancel travels to the reader as a reset; the
// reader's discards its buffer at once and travels as a stop).
func (h *half) cancelWrite(code semantics.StreamErrorCode) {
	p := h.s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if h.w.err != nil || h.wCancelled {
		return
	}
	h.wCancelled, h.wCode = true, code
	signal(&h.wake)
	h.w.out.send(0, func() {
		if h.finRecv || h.resetRecv { // all data arrived already: nothing to reset
			return
		}
		h.resetRecv, h.resetCode = true, code
		h.buf, h.off = nil, 0
		signal(&h.wake)
		h.checkTerminal()
	})
}

func (h *half) cancelRead(code semantics.StreamErrorCode) {
	p := h.s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if h.r.err != nil || h.rCancelled {
		return
	}
	h.rCancelled, h.rCode = true, code
	h.buf, h.off = nil, 0
	signal(&h.wake)
	h.checkTerminal()
	h.r.out.send(0, func() {
		if h.stopRecv {
			return
		}
		h.stopRecv, h.stopCode = true, code
		signal(&h.wake)
	})
}

func (h *half) setReadDeadline(t time.Time) {
	h.s.p.mu.Lock()
	h.rdl = t
	signal(&h.wake)
	h.s.p.mu.Unlock()
}

func (h *half) setWriteDeadline(t time.Time) {
	h.s.p.mu.Lock()
	h.wdl = t
	signal(&h.wake)
	h.s.p.mu.Unlock()
}

// sendEnd is the sending side of a stream at one end.
type sendEnd struct {
	h *half
	s *stream
}

// Write blocks while the peer's buffer (Options.StreamWindow) is full.
func (e *sendEnd) Write(b []byte) (int, error) { return e.h.write(b) }

// Close sends a FIN after the buffered data.
func (e *sendEnd) Close() error { return e.h.close() }

// CancelWrite resets the stream with code.
func (e *sendEnd) CancelWrite(code semantics.StreamErrorCode) { e.h.cancelWrite(code) }

// SetWriteDeadline sets the write deadline; the zero time clears it.
func (e *sendEnd) SetWriteDeadline(t time.Time) error { e.h.setWriteDeadline(t); return nil }

// recvEnd is the receiving side of a stream at one end.
type recvEnd struct {
	h *half
	s *stream
}

// Read returns buffered data, io.EOF after the FIN, or the reset error.
func (e *recvEnd) Read(b []byte) (int, error) { return e.h.read(b) }

// CancelRead asks the peer to stop sending (STOP_SENDING with code).
func (e *recvEnd) CancelRead(code semantics.StreamErrorCode) { e.h.cancelRead(code) }

// SetReadDeadline sets the read deadline; the zero time clears it.
func (e *recvEnd) SetReadDeadline(t time.Time) error { e.h.setReadDeadline(t); return nil }

// bidiEnd is a bidirectional stream at one end.
type bidiEnd struct {
	sendEnd
	recvEnd
}

// SetDeadline sets both deadlines.
func (e *bidiEnd) SetDeadline(t time.Time) error {
	e.sendEnd.h.setWriteDeadline(t)
	e.recvEnd.h.setReadDeadline(t)
	return nil
}

var (
	_ semantics.RawStream     = (*bidiEnd)(nil)
	_ semantics.RawSendStream = (*sendEnd)(nil)
	_ semantics.RawRecvStream = (*recvEnd)(nil)
)
