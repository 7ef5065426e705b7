package semantics

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"time"
)

// RawSendStream is the sending half of a backend stream.
//
// Write blocks under flow control; it returns *StreamError when the peer
// stopped the stream, *ConnError when the connection closed, and an error
// wrapping os.ErrDeadlineExceeded when the write deadline passed.
// Close ends the stream gracefully (FIN) after buffered data.
// CancelWrite abandons it, telling the peer code (RESET_STREAM).
type RawSendStream interface {
	io.Writer
	Close() error
	CancelWrite(code StreamErrorCode)
	SetWriteDeadline(t time.Time) error
}

// RawRecvStream is the receiving half of a backend stream.
//
// Read returns io.EOF after the peer's FIN, *StreamError after the peer's
// reset, *ConnError when the connection closed, and an error wrapping
// os.ErrDeadlineExceeded when the read deadline passed. CancelRead asks the
// peer to stop sending (STOP_SENDING with code).
type RawRecvStream interface {
	io.Reader
	CancelRead(code StreamErrorCode)
	SetReadDeadline(t time.Time) error
}

// RawStream is a bidirectional backend stream.
type RawStream interface {
	RawSendStream
	RawRecvStream
	SetDeadline(t time.Time) error
}

// BackendConn is one authenticated, encrypted connection of a backend. All
// methods are safe for concurrent use.
type BackendConn interface {
	// OpenStream opens a bidirectional stream. It blocks while the peer's
	// stream limit is reached, until ctx is done.
	OpenStream(ctx context.Context) (RawStream, error)
	// OpenUniStream opens a unidirectional (send-only) stream.
	OpenUniStream(ctx context.Context) (RawSendStream, error)
	// AcceptStream waits for the peer's next bidirectional stream.
	AcceptStream(ctx context.Context) (RawStream, error)
	// AcceptUniStream waits for the peer's next unidirectional stream.
	AcceptUniStream(ctx context.Context) (RawRecvStream, error)
	// CloseWithCode closes the connection; the peer observes a *ConnError
	// with the same code and reason (Remote=true). Idempotent.
	CloseWithCode(code CloseCode, reason string) error
	// Context is cancelled when the connection closes, with a *ConnError as
	// its cause (context.Cause).
	Context() context.Context
	LocalAddr() net.Addr
	RemoteAddr() net.Addr
	// ConnectionState returns the TLS state, including the peer's verified
	// certificate chains.
	ConnectionState() tls.ConnectionState
	// Backend names the backend: "quic", "webtransport", "yamux", "memory".
	Backend() string
}

// BackendListener accepts backend connections. Accept returns after the TLS
// handshake completed (and client certificates were verified if required).
type BackendListener interface {
	Accept(ctx context.Context) (BackendConn, error)
	Addr() net.Addr
	Close() error
}

// BackendDialer dials backend connections to addr (host:port or a backend
// URL, as the backend documents).
type BackendDialer interface {
	Dial(ctx context.Context, addr string) (BackendConn, error)
}

// StreamCreditor is implemented by backend connections whose flow control
// grants the peer a fixed number of concurrently open incoming streams per
// direction type (QUIC MAX_STREAMS, yamux's accept backlog and stream
// cap, the memory backend's MaxIncomingStreams). NewConn logs a warning
// (once per backend and values) when it is below Limits.MaxStreams: the
// backend would block streams the Limits admit, because it was not given
// the same Limits (its Config.Limits; see Limits.StreamCredit).
type StreamCreditor interface {
	// IncomingStreamCredit returns the smaller of the bidirectional and
	// unidirectional credits.
	IncomingStreamCredit() int
}

// StreamPusher is implemented by a BackendConn whose peer's streams
// already arrive on a goroutine of the backend's own (yamux: one loop
// takes every stream from the session and reads its direction marker).
// Conn then has the backend hand each stream to it instead of calling
// AcceptStream and AcceptUniStream on two goroutines waiting for the next
// one: an idle connection costs two goroutines less (issue 26 item 1).
// Backends whose library accepts each direction with a blocking call
// (quic-go) gain nothing and do not implement it.
type StreamPusher interface {
	// PushStreams makes bidi and uni the receivers of every stream the
	// peer opens from now on, and of those the backend holds already, and
	// starts taking streams if it had not. They are called on the
	// backend's goroutines, possibly concurrently, and must not block.
	// After the call AcceptStream and AcceptUniStream are not used. It
	// returns false when the backend cannot push (Conn then accepts).
	PushStreams(bidi func(RawStream), uni func(RawRecvStream)) bool
}

// BulkHinter is implemented by backends that can report how much data is
// queued below the application (for example unsent bytes in a kernel socket
// buffer). The priority scheduler uses it, when present, to keep bulk data
// from building a queue that control frames must wait behind.
type BulkHinter interface {
	// QueuedBytes returns an estimate of bytes accepted by Write but not yet
	// put on the wire.
	QueuedBytes() int
}

// BulkChunkHinter is implemented by backend connections whose cost per
// write is high enough that bulk data should be cut into larger chunks
// than DefaultBulkChunk. TLS+yamux is one: each write is a yamux frame,
// two channel hand-offs to its send loop and one wake-up of the peer's
// reader, where QUIC packs any write into datagrams of its own. NewConn
// uses the hint as Limits.BulkChunk when the configuration leaves
// BulkChunk zero; a configured BulkChunk always wins. A larger chunk
// lengthens how long a control frame may wait behind one bulk write (a
// 64 KiB chunk is 0.5 ms on a 1 Gbit/s path).
type BulkChunkHinter interface {
	// PreferredBulkChunk returns the bulk chunk size in bytes (≤ 0: no
	// preference).
	PreferredBulkChunk() int
}

// PeerHinter is implemented by backend connections that can hear, from
// outside the connection, that the peer may have lost it: a QUIC daemon
// that restarted after a crash sends a restart hint (a non-QUIC datagram)
// from its listening socket to the addresses of the connections its
// previous process held (docs/protocols/internal/restart-hint.md). The
// hint is not authenticated: the engine answers it by sending on the
// connection at once (an agent sends a heartbeat); a peer that really lost
// the connection answers that packet with a QUIC stateless reset, which is
// authenticated and ends it, and a peer that answers nothing for a short
// window is given up on. A forged hint costs a heartbeat.
type PeerHinter interface {
	// PeerHints returns a channel that receives a value (coalesced: at
	// most one pending) each time such a hint arrives. It is never closed.
	PeerHints() <-chan struct{}
}
