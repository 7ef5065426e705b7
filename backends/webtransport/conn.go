package webtransport

import (
	"context"
	"crypto/tls"
	"net"
	"time"

	quicgo "github.com/quic-go/quic-go"
	wt "github.com/quic-go/webtransport-go"

	"forgeyard.dev/transport/backends/internal/qadapt"
	fyquic "forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

var (
	_ semantics.BackendConn   = (*conn)(nil)
	_ semantics.BulkHinter    = (*conn)(nil)
	_ semantics.RawStream     = (*stream)(nil)
	_ semantics.RawSendStream = (*sendStream)(nil)
	_ semantics.RawRecvStream = (*recvStream)(nil)

	_ semantics.RestartTokenHinter = (*conn)(nil)
)

// causeWait bounds how long a session that ended without a WebTransport
// close waits for its QUIC connection to report why.
const causeWait = time.Second

// conn adapts one *wt.Session (and the QUIC connection that carries only
// it). All methods are safe for concurrent use.
type conn struct {
	sess   *wt.Session
	qc     *quicgo.Conn
	hint   *fyquic.DelayHint // nil unless Config.DelayHintMaxRTT > 0
	ctx    context.Context   // cancelled with the *semantics.ConnError
	cancel context.CancelCauseFunc
	credit int                // WebTransport streams the peer may open (Config.StreamCredit)
	hints  *fyquic.HintTarget // restart hints of a dialled connection; nil on accepted ones
}

// PeerHints implements semantics.PeerHinter: the restart hints a dialled
// connection's socket received from its peer (backends/quic restart
// hints) that do not carry the armed token. An accepted connection never
// gets one (nil).
func (c *conn) PeerHints() <-chan struct{} { return c.hints.Hints() }

// PeerRestarted implements semantics.RestartTokenHinter: hints carrying
// the armed token. Nil on an accepted connection.
func (c *conn) PeerRestarted() <-chan struct{} { return c.hints.Restarted() }

// ArmRestartToken implements semantics.RestartTokenHinter (a no-op on an
// accepted connection).
func (c *conn) ArmRestartToken(t semantics.RestartToken) { c.hints.Arm(t) }

// IncomingStreamCredit implements semantics.StreamCreditor.
func (c *conn) IncomingStreamCredit() int { return c.credit }

// newConn wraps sess on qc. release (may be nil) runs once after the
// connection is gone.
func newConn(sess *wt.Session, qc *quicgo.Conn, release func(), hintMaxRTT time.Duration) *conn {
	ctx, cancel := context.WithCancelCause(context.Background())
	c := &conn{sess: sess, qc: qc, ctx: ctx, cancel: cancel}
	if hintMaxRTT > 0 {
		c.hint = fyquic.NewDelayHint(qc, hintMaxRTT)
	}
	context.AfterFunc(sess.Context(), func() {
		if ctx.Err() == nil { // else CloseWithCode recorded the local close
			cancel(c.closeCause())
		}
		ce, ok := context.Cause(ctx).(*semantics.ConnError)
		if !ok {
			ce = fallbackConnError(nil)
		}
		// One session per QUIC connection: the connection goes with it,
		// carrying the same code (a no-op if it is already closed).
		_ = qc.CloseWithError(quicgo.ApplicationErrorCode(ce.Code), wire.TruncateUTF8(ce.Reason, wire.MaxCloseReason))
		if release != nil {
			context.AfterFunc(qc.Context(), release)
		}
	})
	return c
}

// QueuedBytes implements semantics.BulkHinter: the DelayHint estimate
// with Config.DelayHintMaxRTT > 0, else 0 (nothing is queued above quic-go).
func (c *conn) QueuedBytes() int {
	if c.hint == nil {
		return 0
	}
	return c.hint.QueuedBytes()
}

// closeCause works out why the session ended: its WebTransport close
// (SessionError), else the QUIC connection's close, else a protocol error.
func (c *conn) closeCause() *semantics.ConnError {
	// After the session ended, AcceptStream returns its close error at once.
	done, cancel := context.WithCancel(context.Background())
	cancel()
	_, serr := c.sess.AcceptStream(done)
	if ce := sessionConnError(serr); ce != nil {
		return ce
	}
	t := time.NewTimer(causeWait)
	defer t.Stop()
	select {
	case <-c.qc.Context().Done():
		if ce := fyquic.ConnErrorOf(context.Cause(c.qc.Context())); ce != nil {
			return ce
		}
	case <-t.C:
	}
	return fallbackConnError(serr)
}

// OpenStream, OpenUniStream, AcceptStream and AcceptUniStream adapt the
// library's stream or translate its error (qadapt.Stream).
func (c *conn) OpenStream(ctx context.Context) (semantics.RawStream, error) {
	return qadapt.Stream(ctx, c.sess.OpenStreamSync, c.translate, c.newStream)
}

func (c *conn) OpenUniStream(ctx context.Context) (semantics.RawSendStream, error) {
	return qadapt.Stream(ctx, c.sess.OpenUniStreamSync, c.translate, c.newSendStream)
}

func (c *conn) AcceptStream(ctx context.Context) (semantics.RawStream, error) {
	return qadapt.Stream(ctx, c.sess.AcceptStream, c.translate, c.newStream)
}

func (c *conn) AcceptUniStream(ctx context.Context) (semantics.RawRecvStream, error) {
	return qadapt.Stream(ctx, c.sess.AcceptUniStream, c.translate, c.newRecvStream)
}

func (c *conn) newStream(s *wt.Stream) semantics.RawStream { return &stream{s: s, c: c} }

func (c *conn) newSendStream(s *wt.SendStream) semantics.RawSendStream {
	return &sendStream{s: s, c: c}
}

func (c *conn) newRecvStream(s *wt.ReceiveStream) semantics.RawRecvStream {
	return &recvStream{s: s, c: c}
}

// CloseWithCode closes the session with SessionErrorCode uint32(code) and
// reason (cut to wire.MaxCloseReason bytes), then the QUIC connection with
// the same code. Context is cancelled (with the local *ConnError) before
// the peer can learn of the close. Idempotent: later calls do nothing and
// return nil.
func (c *conn) CloseWithCode(code semantics.CloseCode, reason string) error {
	reason = wire.TruncateUTF8(reason, wire.MaxCloseReason)
	if c.sess.Context().Err() == nil {
		c.cancel(&semantics.ConnError{Code: code, Reason: reason})
	}
	_ = c.sess.CloseWithError(wt.SessionErrorCode(code), reason)
	<-c.ctx.Done()
	return nil
}

func (c *conn) Context() context.Context { return c.ctx }
func (c *conn) LocalAddr() net.Addr      { return c.sess.LocalAddr() }
func (c *conn) RemoteAddr() net.Addr     { return c.sess.RemoteAddr() }

// ConnectionState returns the TLS state of the QUIC connection (ALPN "h3";
// the session's application protocol is "forgeyard/1").
func (c *conn) ConnectionState() tls.ConnectionState {
	return c.sess.SessionState().ConnectionState.TLS
}

func (c *conn) Backend() string { return "webtransport" }

// stream adapts *wt.Stream. It and sendStream and recvStream stay apart
// from backends/quic's look-alike adapters on purpose (see there: other
// library types and error-code widths, no closeError quirk, no indirect
// call on the data path).
type stream struct {
	s *wt.Stream
	c *conn
}

func (s *stream) Read(p []byte) (int, error) {
	n, err := s.s.Read(p)
	return n, s.c.translate(err)
}

func (s *stream) Write(p []byte) (int, error) {
	n, err := s.s.Write(p)
	return n, s.c.translate(err)
}

func (s *stream) Close() error { return s.c.translate(s.s.Close()) }

func (s *stream) CancelWrite(code semantics.StreamErrorCode) {
	s.s.CancelWrite(wt.StreamErrorCode(code))
}

func (s *stream) CancelRead(code semantics.StreamErrorCode) {
	s.s.CancelRead(wt.StreamErrorCode(code))
}

func (s *stream) SetDeadline(t time.Time) error      { return s.s.SetDeadline(t) }
func (s *stream) SetReadDeadline(t time.Time) error  { return s.s.SetReadDeadline(t) }
func (s *stream) SetWriteDeadline(t time.Time) error { return s.s.SetWriteDeadline(t) }

// sendStream adapts *wt.SendStream. It and recvStream repeat stream's
// halves for the reason given at backends/quic's sendStream.
type sendStream struct {
	s *wt.SendStream
	c *conn
}

func (s *sendStream) Write(p []byte) (int, error) {
	n, err := s.s.Write(p)
	return n, s.c.translate(err)
}

func (s *sendStream) Close() error { return s.c.translate(s.s.Close()) }

func (s *sendStream) CancelWrite(code semantics.StreamErrorCode) {
	s.s.CancelWrite(wt.StreamErrorCode(code))
}

func (s *sendStream) SetWriteDeadline(t time.Time) error { return s.s.SetWriteDeadline(t) }

// recvStream adapts *wt.ReceiveStream.
type recvStream struct {
	s *wt.ReceiveStream
	c *conn
}

func (s *recvStream) Read(p []byte) (int, error) {
	n, err := s.s.Read(p)
	return n, s.c.translate(err)
}

func (s *recvStream) CancelRead(code semantics.StreamErrorCode) {
	s.s.CancelRead(wt.StreamErrorCode(code))
}

func (s *recvStream) SetReadDeadline(t time.Time) error { return s.s.SetReadDeadline(t) }
