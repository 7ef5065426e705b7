package quic

import (
	"time"

	quicgo "github.com/quic-go/quic-go"

	"forgeyard.dev/transport/semantics"
)

// Compile-time checks.
var (
	_ semantics.RawStream     = (*stream)(nil)
	_ semantics.RawSendStream = (*sendStream)(nil)
	_ semantics.RawRecvStream = (*recvStream)(nil)
)

// stream adapts *quicgo.Stream. Like quic-go, Read and Write may run
// concurrently with each other but not with themselves.
//
// stream, sendStream and recvStream look like backends/webtransport's
// adapters but stay separate: they wrap other library types (quic-go's
// streams, with 62-bit error codes, against webtransport-go's, with 32-bit
// ones), Close here corrects a quic-go quirk (closeError) that
// webtransport-go's streams do not have, and a shared generic adapter
// would put an indirect call on every Read and Write of the data path.
// What is backend-neutral in them, the error pairing, is shared
// (backends/internal/errpair).
type stream struct {
	s *quicgo.Stream
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

func (s *stream) Close() error { return s.c.translate(closeError(s.s.Context(), s.s.Close())) }

func (s *stream) CancelWrite(code semantics.StreamErrorCode) {
	s.s.CancelWrite(quicgo.StreamErrorCode(code))
}

func (s *stream) CancelRead(code semantics.StreamErrorCode) {
	s.s.CancelRead(quicgo.StreamErrorCode(code))
}

func (s *stream) SetDeadline(t time.Time) error      { return s.s.SetDeadline(t) }
func (s *stream) SetReadDeadline(t time.Time) error  { return s.s.SetReadDeadline(t) }
func (s *stream) SetWriteDeadline(t time.Time) error { return s.s.SetWriteDeadline(t) }

// sendStream adapts *quicgo.SendStream (the opening side of a uni stream).
// It and recvStream repeat stream's send and receive halves line for line
// because quic-go's uni streams are other types than its bidi stream (whose
// halves it does not expose); sharing them would take the type parameter,
// and so the indirect Read and Write, that stream avoids.
type sendStream struct {
	s *quicgo.SendStream
	c *conn
}

func (s *sendStream) Write(p []byte) (int, error) {
	n, err := s.s.Write(p)
	return n, s.c.translate(err)
}

func (s *sendStream) Close() error { return s.c.translate(closeError(s.s.Context(), s.s.Close())) }

func (s *sendStream) CancelWrite(code semantics.StreamErrorCode) {
	s.s.CancelWrite(quicgo.StreamErrorCode(code))
}

func (s *sendStream) SetWriteDeadline(t time.Time) error { return s.s.SetWriteDeadline(t) }

// recvStream adapts *quicgo.ReceiveStream (the accepting side of a uni
// stream).
type recvStream struct {
	s *quicgo.ReceiveStream
	c *conn
}

func (s *recvStream) Read(p []byte) (int, error) {
	n, err := s.s.Read(p)
	return n, s.c.translate(err)
}

func (s *recvStream) CancelRead(code semantics.StreamErrorCode) {
	s.s.CancelRead(quicgo.StreamErrorCode(code))
}

func (s *recvStream) SetReadDeadline(t time.Time) error { return s.s.SetReadDeadline(t) }
