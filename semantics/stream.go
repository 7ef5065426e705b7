package semantics

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/wire"
)

// maxKeptFrameBuf bounds the frame buffer a SendStream keeps between
// WriteFrame calls, so idle streams hold little memory.
const maxKeptFrameBuf = 4 << 10

// SendStream is the sending half of a stream opened or accepted on a Conn.
// Its writes go through the connection's priority scheduler. Write,
// WriteFrame and WriteEnvelope may be called concurrently (they are
// serialized, so frames never interleave); the other methods may be called
// at any time.
//
// The stream holds a slot of the stream limits until it is done: the send
// half is done after Close, CancelWrite, or a Write that failed with a
// *StreamError or *ConnError.
type SendStream struct {
	c    *Conn
	raw  RawSendStream
	kind StreamKind
	sl   *slot
	prio atomic.Uint32
	wdl  atomic.Int64 // write deadline in Unix nanoseconds; 0 none
	done sync.Once

	wmu  sync.Mutex
	fbuf []byte // guarded by wmu
}

// RecvStream is the receiving half of a stream. Read and ReadFrame must not
// be called concurrently with each other (one reader); CancelRead and
// SetReadDeadline may be called at any time.
//
// The receive half is done (releasing its part of the stream's limit slot)
// once Read or ReadFrame returned io.EOF or a *StreamError/*ConnError, or
// after CancelRead. Read a stream to its end or cancel it.
type RecvStream struct {
	c       *Conn
	raw     RawRecvStream
	kind    StreamKind
	version wire.ProtocolVersion
	fr      *wire.FrameReader
	sl      *slot
	sibling *SendStream // the send half of a bidi stream, nil for uni
	done    sync.Once
}

// Stream is a bidirectional stream: a SendStream and a RecvStream sharing
// one limit slot, released when both halves are done.
type Stream struct {
	SendStream
	RecvStream
	raw RawStream
}

func newSendStream(c *Conn, raw RawSendStream, kind StreamKind, sl *slot) *SendStream {
	sl.halves.Store(1)
	s := &SendStream{c: c, raw: raw, kind: kind, sl: sl}
	s.prio.Store(uint32(DefaultPriority(kind)))
	return s
}

func newStream(c *Conn, raw RawStream, kind StreamKind, sl *slot) *Stream {
	s := &Stream{raw: raw}
	initBidi(s, c, raw, wire.StreamHeader{Kind: kind, Version: wire.Current},
		wire.NewFrameReader(raw, c.lim.MaxFrame[kind]), sl)
	return s
}

func newAcceptedStream(c *Conn, raw RawStream, hdr wire.StreamHeader, fr *wire.FrameReader, sl *slot) *Stream {
	s := &Stream{raw: raw}
	initBidi(s, c, raw, hdr, fr, sl)
	return s
}

func initBidi(s *Stream, c *Conn, raw RawStream, hdr wire.StreamHeader, fr *wire.FrameReader, sl *slot) {
	sl.halves.Store(2)
	s.SendStream.c, s.SendStream.raw, s.SendStream.kind, s.SendStream.sl = c, raw, hdr.Kind, sl
	s.SendStream.prio.Store(uint32(DefaultPriority(hdr.Kind)))
	s.RecvStream = RecvStream{c: c, raw: raw, kind: hdr.Kind, version: hdr.Version, fr: fr, sl: sl, sibling: &s.SendStream}
}

func newRecvStream(c *Conn, raw RawRecvStream, hdr wire.StreamHeader, fr *wire.FrameReader, sl *slot) *RecvStream {
	sl.halves.Store(1)
	return &RecvStream{c: c, raw: raw, kind: hdr.Kind, version: hdr.Version, fr: fr, sl: sl}
}

// ---- SendStream ----

// Kind returns the stream's kind.
func (s *SendStream) Kind() StreamKind { return s.kind }

// Priority returns the priority of the stream's writes (initially
// DefaultPriority(Kind())).
func (s *SendStream) Priority() Priority { return Priority(s.prio.Load()) }

// SetPriority changes the priority of later writes; values above
// PriorityCAS are treated as PriorityCAS.
func (s *SendStream) SetPriority(p Priority) {
	if p >= NumPriorities {
		p = PriorityCAS
	}
	s.prio.Store(uint32(p))
}

// writeHeader sends the StreamHeader; called once before the stream is
// returned to the opener. A fresh stream has flow-control credit, so this
// does not wait for the peer.
func (s *SendStream) writeHeader() error {
	hdr := wire.AppendStreamHeaderFrame(make([]byte, 0, 8), wire.StreamHeader{Kind: s.kind, Version: wire.Current})
	tok := s.c.sched.beginUrgent(PriorityControl, len(hdr))
	n, err := s.raw.Write(hdr)
	s.c.sched.endUrgent(tok, PriorityControl, len(hdr), n)
	s.c.bytesOut(s.kind, n)
	return err
}

// Write writes p. Non-bulk priorities write at once; bulk priorities (log,
// CAS) write in chunks of at most Limits.BulkChunk bytes, each after
// higher-priority traffic (see sched.go). Errors: *StreamError (reset by
// either side), *ConnError, or an error wrapping os.ErrDeadlineExceeded.
func (s *SendStream) Write(p []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.write(p)
}

func (s *SendStream) write(p []byte) (int, error) {
	sc := s.c.sched
	prio := s.Priority()
	if !prio.IsBulk() {
		tok := sc.beginUrgent(prio, len(p))
		n, err := s.raw.Write(p)
		sc.endUrgent(tok, prio, len(p), n)
		s.c.bytesOut(s.kind, n)
		return n, s.werr(err)
	}
	sc.enqueueBulk(prio, len(p))
	n := 0
	for n < len(p) {
		k := min(len(p)-n, s.c.lim.BulkChunk)
		if err := sc.acquireBulk(prio, s.c.ctx.Done(), s.deadline()); err != nil {
			sc.dequeueBulk(prio, len(p)-n)
			if err == errSchedClosed {
				err = s.c.closeErr()
			}
			return n, s.werr(err)
		}
		m, err := s.raw.Write(p[n : n+k])
		sc.releaseBulk(prio, k, m)
		s.c.bytesOut(s.kind, m)
		n += m
		if err != nil {
			sc.dequeueBulk(prio, len(p)-n-(k-m))
			return n, s.werr(err)
		}
	}
	return n, nil
}

func (s *SendStream) deadline() time.Time {
	if ns := s.wdl.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// werr marks the send half done on terminal errors.
func (s *SendStream) werr(err error) error {
	if err == nil {
		return nil
	}
	var se *StreamError
	var ce *ConnError
	if errors.As(err, &se) || errors.As(err, &ce) {
		s.halfDone()
	}
	return err
}

func (s *SendStream) halfDone() { s.done.Do(s.sl.halfDone) }

// WriteFrame writes one frame `varint(len) ‖ body`, where body is what
// appendBody appends, refusing bodies above the kind's Limits.MaxFrame with
// *wire.FrameTooLargeError (nothing is written then).
func (s *SendStream) WriteFrame(appendBody func([]byte) []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	b, err := wire.AppendFrame(s.fbuf[:0], s.c.lim.MaxFrame[s.kind], appendBody)
	if cap(b) <= maxKeptFrameBuf {
		s.fbuf = b[:0]
	} else {
		s.fbuf = nil
	}
	if err != nil {
		return err
	}
	_, err = s.write(b)
	return err
}

// WriteEnvelope writes e as one frame; see WriteFrame. When the Conn has a
// Config.SendCheck, the payload's type passes it first: a refusal is a
// *SendRefusedError and nothing is written.
func (s *SendStream) WriteEnvelope(e *wire.Envelope) error {
	if chk := s.c.check; chk != nil {
		t := wire.MessageTypeId(0)
		if e.Payload != nil {
			t = e.Payload.MessageType()
		}
		if err := chk.CheckSend(t); err != nil {
			return &SendRefusedError{Type: t, Err: err}
		}
	}
	return s.WriteFrame(e.AppendPostcard)
}

// Close ends the stream gracefully (FIN after the written data).
func (s *SendStream) Close() error {
	err := s.raw.Close()
	s.halfDone()
	return err
}

// CancelWrite abandons the stream; the peer's reads fail with
// *StreamError{Code: code, Remote: true}.
func (s *SendStream) CancelWrite(code StreamErrorCode) {
	s.raw.CancelWrite(code)
	s.halfDone()
}

// SetWriteDeadline sets the deadline for Write, including time spent
// waiting in the scheduler. The zero time clears it.
func (s *SendStream) SetWriteDeadline(t time.Time) error {
	if t.IsZero() {
		s.wdl.Store(0)
	} else {
		s.wdl.Store(t.UnixNano())
	}
	return s.raw.SetWriteDeadline(t)
}

// ---- RecvStream ----

// Kind returns the stream's kind.
func (s *RecvStream) Kind() StreamKind { return s.kind }

// Version returns the protocol version from the stream's header (for
// streams this side opened, wire.Current).
func (s *RecvStream) Version() wire.ProtocolVersion { return s.version }

// Read reads raw bytes (for byte streams such as a CAS object after its
// header frame). Bytes already buffered by ReadFrame are returned first.
func (s *RecvStream) Read(p []byte) (int, error) {
	n, err := s.fr.Buffered().Read(p)
	s.c.bytesIn(s.kind, n)
	return n, s.rerr(err)
}

// ReadFrame returns the next frame body, at most the kind's
// Limits.MaxFrame bytes. The slice aliases an internal buffer valid until
// the next ReadFrame or Read. It returns io.EOF at a clean end of stream,
// io.ErrUnexpectedEOF inside a frame, and *wire.FrameTooLargeError (the
// stream is then reset with StreamFrameTooLarge) for an oversized frame.
// A read-deadline error that interrupts a frame leaves the framing
// undefined: cancel the stream after it.
func (s *RecvStream) ReadFrame() ([]byte, error) {
	b, err := s.fr.Next()
	if err != nil {
		var tl *wire.FrameTooLargeError
		switch {
		case errors.As(err, &tl):
			s.reset(StreamFrameTooLarge)
		case errors.Is(err, wire.ErrFramePrefix):
			s.reset(StreamProtocolError)
		case errors.Is(err, io.ErrUnexpectedEOF):
			s.halfDone()
		}
		return nil, s.rerr(err)
	}
	s.c.bytesIn(s.kind, len(b))
	return b, nil
}

func (s *RecvStream) reset(code StreamErrorCode) {
	s.CancelRead(code)
	if s.sibling != nil {
		s.sibling.CancelWrite(code)
	}
}

func (s *RecvStream) rerr(err error) error {
	if err == nil {
		return nil
	}
	var se *StreamError
	var ce *ConnError
	if err == io.EOF || errors.As(err, &se) || errors.As(err, &ce) {
		s.halfDone()
	}
	return err
}

func (s *RecvStream) halfDone() { s.done.Do(s.sl.halfDone) }

// CancelRead asks the peer to stop sending; its writes fail with
// *StreamError{Code: code, Remote: true}.
func (s *RecvStream) CancelRead(code StreamErrorCode) {
	s.raw.CancelRead(code)
	s.halfDone()
}

// SetReadDeadline sets the deadline for Read and ReadFrame; the zero time
// clears it.
func (s *RecvStream) SetReadDeadline(t time.Time) error { return s.raw.SetReadDeadline(t) }

// ---- Stream ----

// Kind returns the stream's kind.
func (s *Stream) Kind() StreamKind { return s.SendStream.kind }

// SetDeadline sets both the read and the write deadline.
func (s *Stream) SetDeadline(t time.Time) error {
	_ = s.SendStream.SetWriteDeadline(t)
	return s.raw.SetReadDeadline(t)
}
