package yamux

import (
	"io"
	"time"

	"sync"

	hyamux "github.com/hashicorp/yamux"

	"forgeyard.dev/transport/semantics"
)

// stream wraps a yamux stream with reset codes carried on the control
// stream. It implements semantics.RawStream (and so RawSendStream and
// RawRecvStream). Read and Write may be called concurrently with each other
// and with the cancel and deadline methods.
//
// Life cycle: the send side is done after Close (FIN), CancelWrite
// (ResetStream record; the FIN follows the peer's ResetAck), or the peer's
// StopSending (FIN). The receive side is done after io.EOF, CancelRead
// (StopSending record) or the peer's ResetStream. When both are done the
// stream leaves the connection's table (and, if peer-initiated, frees a
// slot under Config.MaxIncomingStreams).
type stream struct {
	c        *Conn
	ys       *hyamux.Stream
	id       uint32
	incoming bool
	counted  bool // holds a MaxIncomingStreams slot (guarded by c.mu)

	mu       sync.Mutex
	wdone    bool
	werr     error // what Write reports once wdone (nil: ErrWriteAfterClose)
	awaitAck bool  // our ResetStream is not acknowledged yet: FIN deferred
	finSent  bool
	rdone    bool
	rerr     error // sticky read error; nil with rdone means io.EOF
	drained  bool  // data buffered before a remote reset was delivered
	finished bool

	// nextShrink is when Read may next drop yamux's drained receive
	// buffer (nanoseconds since shrinkEpoch); Read goroutine only.
	nextShrink int64
}

// yamux keeps a stream's receive buffer (a bytes.Buffer grown to the
// largest frame it held) until the stream ends: an idle control stream
// kept the 1–2 KiB its registration messages needed, ≈ 3 KiB per idle
// agent at 3,000 (heap profile). Read gives it back with Stream.Shrink
// when a read drains it, at most once per shrinkEvery, so that a busy
// stream does not allocate a new buffer for every frame (bulk).
const shrinkEvery = time.Second

var shrinkEpoch = time.Now()

// Read reads stream data. It returns io.EOF after the peer's FIN,
// *semantics.StreamError after a reset (either side), *semantics.ConnError
// once the connection closed, and an error wrapping os.ErrDeadlineExceeded
// after the read deadline.
func (s *stream) Read(p []byte) (int, error) {
	s.mu.Lock()
	if s.rdone {
		err := s.rerr
		drain := !s.drained && isRemote(err)
		s.mu.Unlock()
		if drain {
			// Data that arrived before the peer's ResetStream is still
			// delivered (QUIC allows either); the read deadline is in the
			// past, so this does not block.
			if n, _ := s.ys.Read(p); n > 0 {
				return n, nil
			}
			s.mu.Lock()
			s.drained = true
			s.mu.Unlock()
		}
		if err == nil {
			err = io.EOF
		}
		return 0, err
	}
	s.mu.Unlock()
	n, err := s.ys.Read(p)
	if err != nil {
		if n > 0 {
			return n, nil
		}
		return 0, s.c.streamError(s, err, true)
	}
	if n < len(p) { // yamux had no more buffered
		if now := int64(time.Since(shrinkEpoch)); now >= s.nextShrink {
			s.nextShrink = now + int64(shrinkEvery)
			s.ys.Shrink()
		}
	}
	return n, nil
}

// Write writes p, blocking under flow control. Errors as for Read, plus
// ErrWriteAfterClose after Close.
func (s *stream) Write(p []byte) (int, error) {
	s.mu.Lock()
	if s.wdone {
		err := s.werr
		s.mu.Unlock()
		if err == nil {
			err = ErrWriteAfterClose
		}
		return 0, err
	}
	s.mu.Unlock()
	s.c.writeSeq.Add(1)
	s.c.inYamux.Add(int64(len(p)))
	n, err := s.ys.Write(p)
	s.c.inYamux.Add(-int64(len(p)))
	if err != nil {
		return n, s.c.streamError(s, err, false)
	}
	return n, nil
}

// Close ends the send side gracefully: the peer reads the data, then io.EOF.
// Closing an already finished send side is a no-op returning nil.
func (s *stream) Close() error {
	s.mu.Lock()
	if s.wdone {
		s.mu.Unlock()
		return nil
	}
	s.wdone, s.finSent = true, true
	s.mu.Unlock()
	_ = s.ys.Close() // yamux's Close never fails; a dead session surfaces on reads
	s.maybeFinish()
	return nil
}

// CancelWrite abandons the send side; the peer's Read returns
// *semantics.StreamError{Code: code, Remote: true}. No-op after Close.
func (s *stream) CancelWrite(code semantics.StreamErrorCode) {
	s.mu.Lock()
	if !s.endWriteLocked(code, false) {
		s.mu.Unlock()
		return
	}
	s.awaitAck = true
	s.mu.Unlock()
	if err := s.c.writeStreamRecord(recReset, s.id, code); err != nil {
		// The connection is failing; nothing will acknowledge.
		s.mu.Lock()
		s.awaitAck = false
		s.mu.Unlock()
		s.maybeFinish()
	}
}

// CancelRead abandons the receive side; the peer's Write returns
// *semantics.StreamError{Code: code, Remote: true}. No-op after io.EOF.
func (s *stream) CancelRead(code semantics.StreamErrorCode) {
	s.mu.Lock()
	ended := s.endReadLocked(code, false)
	s.mu.Unlock()
	if !ended {
		return
	}
	_ = s.c.writeStreamRecord(recStop, s.id, code)
	s.maybeFinish()
}

// endReadLocked ends the read side with *semantics.StreamError{code,
// remote} (a local CancelRead or the peer's ResetStream) and wakes a
// blocked Read, unless the side already ended; it reports whether it did.
// s.mu is held.
func (s *stream) endReadLocked(code semantics.StreamErrorCode, remote bool) bool {
	if s.rdone {
		return false
	}
	s.rdone = true
	s.rerr = &semantics.StreamError{Code: code, Remote: remote}
	_ = s.ys.SetReadDeadline(pastDeadline) // wake a blocked Read
	return true
}

// endWriteLocked is endReadLocked for the write side (a local CancelWrite
// or the peer's StopSending). s.mu is held.
func (s *stream) endWriteLocked(code semantics.StreamErrorCode, remote bool) bool {
	if s.wdone {
		return false
	}
	s.wdone = true
	s.werr = &semantics.StreamError{Code: code, Remote: remote}
	_ = s.ys.SetWriteDeadline(pastDeadline) // wake a blocked Write
	return true
}

// SetReadDeadline sets the deadline for blocked and future Reads; the zero
// time means none.
func (s *stream) SetReadDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rerr != nil {
		t = pastDeadline // keep a woken reader awake
	}
	return s.ys.SetReadDeadline(t)
}

// SetWriteDeadline sets the deadline for blocked and future Writes.
func (s *stream) SetWriteDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.werr != nil {
		t = pastDeadline
	}
	return s.ys.SetWriteDeadline(t)
}

// SetDeadline sets both deadlines.
func (s *stream) SetDeadline(t time.Time) error {
	_ = s.SetReadDeadline(t)
	return s.SetWriteDeadline(t)
}

func isRemote(err error) bool {
	se, ok := err.(*semantics.StreamError)
	return ok && se.Remote
}

// stickyErr returns the recorded error for the read or write side, if the
// side ended by a reset, a stop or a local cancel.
func (s *stream) stickyErr(read bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if read {
		return s.rerr
	}
	return s.werr
}

// sawEOF records the peer's FIN.
func (s *stream) sawEOF() {
	s.mu.Lock()
	s.rdone = true
	s.mu.Unlock()
	s.maybeFinish()
}

// remoteRST handles a yamux-level RST with no ResetStream record.
func (s *stream) remoteRST() error {
	s.mu.Lock()
	if s.rerr == nil {
		s.rerr = &semantics.StreamError{Code: semantics.StreamCancelled, Remote: true}
	}
	s.rdone = true
	err := s.rerr
	if !s.wdone {
		s.wdone = true
		s.werr = err
		s.finSent = true
	}
	s.mu.Unlock()
	s.maybeFinish()
	return err
}

// remoteReset applies the peer's ResetStream record.
func (s *stream) remoteReset(code semantics.StreamErrorCode) {
	s.mu.Lock()
	ended := s.endReadLocked(code, true)
	s.mu.Unlock()
	if ended {
		s.maybeFinish()
	}
}

// remoteStop applies the peer's StopSending record: writes fail with the
// code and our FIN goes out at once (the peer no longer reads).
// Alike in shape to CancelWrite, but the peer asked: no reset record, no
// ack awaited, the FIN goes out at once.
func (s *stream) remoteStop(code semantics.StreamErrorCode) {
	s.mu.Lock()
	if !s.endWriteLocked(code, true) {
		s.mu.Unlock()
		return
	}
	s.finSent = true
	s.mu.Unlock()
	_ = s.ys.Close()
	s.maybeFinish()
}

// resetAcked sends the FIN deferred by CancelWrite.
func (s *stream) resetAcked() {
	s.mu.Lock()
	if !s.awaitAck {
		s.mu.Unlock()
		return
	}
	s.awaitAck = false
	fin := !s.finSent
	s.finSent = true
	s.mu.Unlock()
	if fin {
		_ = s.ys.Close()
	}
	s.maybeFinish()
}

// refuse rejects an incoming stream with StreamRefused.
func (s *stream) refuse(bidi bool) { s.refuseCode(semantics.StreamRefused, bidi) }

func (s *stream) refuseCode(code semantics.StreamErrorCode, bidi bool) {
	s.CancelRead(code)
	if bidi {
		s.CancelWrite(code)
	} else {
		s.Close()
	}
}

// abandon drops a stream whose opening failed.
func (s *stream) abandon() {
	s.mu.Lock()
	s.rdone, s.wdone, s.finished = true, true, true
	s.mu.Unlock()
	s.c.unregister(s)
}

// maybeFinish unregisters the stream once both sides are done and no
// acknowledgement is outstanding.
func (s *stream) maybeFinish() {
	s.mu.Lock()
	if s.finished || !s.wdone || !s.rdone || s.awaitAck {
		s.mu.Unlock()
		return
	}
	s.finished = true
	s.mu.Unlock()
	s.c.unregister(s)
}
