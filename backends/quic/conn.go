package quic

import (
	"context"
	"crypto/tls"
	"net"
	"net/netip"
	"time"

	quicgo "github.com/quic-go/quic-go"

	"forgeyard.dev/transport/backends/internal/qadapt"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

var (
	_ semantics.BackendConn = (*conn)(nil)
	_ semantics.BulkHinter  = (*conn)(nil)

	_ semantics.RestartTokenHinter = (*conn)(nil)
)

// conn adapts *quicgo.Conn to semantics.BackendConn. All methods are safe
// for concurrent use (quic-go's are).
type conn struct {
	qc     *quicgo.Conn
	hint   *DelayHint      // nil unless Config.DelayHintMaxRTT > 0
	ctx    context.Context // cancelled with the *semantics.ConnError when qc closes
	cancel context.CancelCauseFunc
	credit int // the smaller stream credit granted to the peer (Config)
	// remote is the peer's address; hints, on a dialled connection, gets
	// its restart hints (endpoint.watchHints), nil on accepted ones.
	remote netip.AddrPort
	hints  *HintTarget
}

// PeerHints implements semantics.PeerHinter: restart hints from the peer's
// address (restarthint.go) that do not carry the armed token. An accepted
// connection never gets one (nil).
func (c *conn) PeerHints() <-chan struct{} { return c.hints.Hints() }

// PeerRestarted implements semantics.RestartTokenHinter: hints carrying
// the armed token. Nil on an accepted connection.
func (c *conn) PeerRestarted() <-chan struct{} { return c.hints.Restarted() }

// ArmRestartToken implements semantics.RestartTokenHinter (a no-op on an
// accepted connection).
func (c *conn) ArmRestartToken(t semantics.RestartToken) { c.hints.Arm(t) }

// IncomingStreamCredit implements semantics.StreamCreditor.
func (c *conn) IncomingStreamCredit() int { return c.credit }

// newConn wraps qc. release (may be nil) runs once after qc closed.
func newConn(qc *quicgo.Conn, release func(), hintMaxRTT time.Duration) *conn {
	ctx, cancel := context.WithCancelCause(context.Background())
	context.AfterFunc(qc.Context(), func() {
		cause := ConnErrorOf(context.Cause(qc.Context()))
		if cause == nil {
			cause = &semantics.ConnError{Code: wire.CloseInternalError, Reason: "quic connection ended: " + context.Cause(qc.Context()).Error()}
		}
		cancel(cause)
		if release != nil {
			release()
		}
	})
	c := &conn{qc: qc, ctx: ctx, cancel: cancel}
	c.remote, _ = addrPort(qc.RemoteAddr())
	if hintMaxRTT > 0 {
		c.hint = NewDelayHint(qc, hintMaxRTT)
	}
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

// OpenStream, OpenUniStream, AcceptStream and AcceptUniStream adapt the
// library's stream or translate its error (qadapt.Stream).
func (c *conn) OpenStream(ctx context.Context) (semantics.RawStream, error) {
	return qadapt.Stream(ctx, c.qc.OpenStreamSync, c.translate, c.newStream)
}

// The open/accept methods and CloseWithCode are alike in shape to
// backends/webtransport's, but over quic-go's connection and its 62-bit
// application codes where that one has a session and 32-bit session codes:
// the shared part is qadapt.Stream.
func (c *conn) OpenUniStream(ctx context.Context) (semantics.RawSendStream, error) {
	return qadapt.Stream(ctx, c.qc.OpenUniStreamSync, c.translate, c.newSendStream)
}

func (c *conn) AcceptStream(ctx context.Context) (semantics.RawStream, error) {
	return qadapt.Stream(ctx, c.qc.AcceptStream, c.translate, c.newStream)
}

func (c *conn) AcceptUniStream(ctx context.Context) (semantics.RawRecvStream, error) {
	return qadapt.Stream(ctx, c.qc.AcceptUniStream, c.translate, c.newRecvStream)
}

func (c *conn) newStream(s *quicgo.Stream) semantics.RawStream { return &stream{s: s, c: c} }

func (c *conn) newSendStream(s *quicgo.SendStream) semantics.RawSendStream {
	return &sendStream{s: s, c: c}
}

func (c *conn) newRecvStream(s *quicgo.ReceiveStream) semantics.RawRecvStream {
	return &recvStream{s: s, c: c}
}

// CloseWithCode sends CONNECTION_CLOSE with application error code
// uint64(code) and reason (cut to wire.MaxCloseReason bytes). Context is
// cancelled (with the local *ConnError) before the peer can learn of the
// close, and CloseWithCode returns after the connection is closed.
// Idempotent: later calls do nothing and return nil.
func (c *conn) CloseWithCode(code semantics.CloseCode, reason string) error {
	reason = wire.TruncateUTF8(reason, wire.MaxCloseReason)
	if c.qc.Context().Err() == nil {
		c.cancel(&semantics.ConnError{Code: code, Reason: reason})
	}
	_ = c.qc.CloseWithError(quicgo.ApplicationErrorCode(code), reason)
	<-c.ctx.Done()
	return nil
}

func (c *conn) Context() context.Context { return c.ctx }

// translate is TranslateError that also settles Context: once an
// operation reports a connection error, Context is done with that error as
// its cause (before the caller sees it), so callers never observe a closed
// connection whose Context is still live.
func (c *conn) translate(err error) error {
	err = TranslateError(err)
	if err != nil && c.ctx.Err() == nil {
		if ce := ConnErrorOf(err); ce != nil {
			c.cancel(ce)
		}
	}
	return err
}
func (c *conn) LocalAddr() net.Addr  { return c.qc.LocalAddr() }
func (c *conn) RemoteAddr() net.Addr { return c.qc.RemoteAddr() }

func (c *conn) ConnectionState() tls.ConnectionState { return c.qc.ConnectionState().TLS }

func (c *conn) Backend() string { return "quic" }

// checkALPN rejects a connection that negotiated anything but ALPN.
// quic-go requires ALPN, and our TLS configs offer only ALPN, so this is
// defence in depth against a caller-modified tls.Config.
func checkALPN(qc *quicgo.Conn) error {
	if got := qc.ConnectionState().TLS.NegotiatedProtocol; got != ALPN {
		reason := "ALPN " + ALPN + " required, negotiated " + `"` + got + `"`
		_ = qc.CloseWithError(quicgo.ApplicationErrorCode(wire.CloseProtocolError), reason)
		return &semantics.ConnError{Code: wire.CloseProtocolError, Reason: reason}
	}
	return nil
}
