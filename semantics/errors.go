package semantics

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"

	"forgeyard.dev/transport/wire"
)

// CloseCode is the connection close reason table (§102–103), defined in
// wire so the numbers are part of the protocol.
type CloseCode = wire.CloseCode

// StreamKind identifies what a stream carries (§40).
type StreamKind = wire.StreamKind

// StreamErrorCode is the code of a stream reset (RESET_STREAM/STOP_SENDING).
// Stable values; every backend carries them unchanged.
type StreamErrorCode uint32

// Stream error codes.
const (
	StreamCancelled     StreamErrorCode = 0 // the application abandoned the stream
	StreamRefused       StreamErrorCode = 1 // a stream limit was reached (§133)
	StreamProtocolError StreamErrorCode = 2 // malformed header or frame (§140)
	StreamUnknownKind   StreamErrorCode = 3 // unknown StreamKind (§184)
	StreamFrameTooLarge StreamErrorCode = 4 // frame above the kind's limit
	StreamInternalError StreamErrorCode = 5
	StreamShutdown      StreamErrorCode = 6 // the endpoint is shutting down
	StreamForbidden     StreamErrorCode = 7 // not authorized (lease/object scope)
)

var streamCodeNames = [...]string{"Cancelled", "Refused", "ProtocolError", "UnknownKind",
	"FrameTooLarge", "InternalError", "Shutdown", "Forbidden"}

// String returns the code's name, or StreamErrorCode(n) for a code this build does not define.
func (c StreamErrorCode) String() string {
	if int(c) < len(streamCodeNames) {
		return streamCodeNames[c]
	}
	return "StreamErrorCode(" + strconv.FormatUint(uint64(c), 10) + ")"
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (c StreamErrorCode) LogValue() slog.Value { return slog.StringValue(c.String()) }

// StreamError reports a stream reset by either side. Compare with errors.As;
// Remote says which side reset it.
type StreamError struct {
	Code   StreamErrorCode
	Remote bool
}

// Alike in shape to ConnError.Error, but each says its side in its own
// words ("reset by local", "closed locally"): stable message text.
// Error says which side reset the stream and with which code.
func (e *StreamError) Error() string {
	side := "local"
	if e.Remote {
		side = "remote"
	}
	return fmt.Sprintf("stream reset by %s: %s", side, e.Code)
}

// Is makes errors.Is(err, &StreamError{Code: c}) match on code only.
func (e *StreamError) Is(target error) bool {
	t, ok := target.(*StreamError)
	return ok && t.Code == e.Code
}

// ConnError reports a closed connection with its CloseCode. Remote says
// whether the peer closed it. It unwraps to net.ErrClosed so callers that
// only care about "closed" can use errors.Is(err, net.ErrClosed).
type ConnError struct {
	Code   CloseCode
	Reason string
	Remote bool
}

// Error says which side closed the connection, its close code and, when given, the reason.
func (e *ConnError) Error() string {
	side := "locally"
	if e.Remote {
		side = "by peer"
	}
	if e.Reason == "" {
		return fmt.Sprintf("connection closed %s: %s", side, e.Code)
	}
	return fmt.Sprintf("connection closed %s: %s: %s", side, e.Code, e.Reason)
}

// Unwrap returns net.ErrClosed.
func (e *ConnError) Unwrap() error { return net.ErrClosed }

// Is makes errors.Is(err, &ConnError{Code: c}) match on code only.
func (e *ConnError) Is(target error) bool {
	t, ok := target.(*ConnError)
	return ok && t.Code == e.Code
}

// ErrDeadline is returned (wrapped) when a read or write deadline passes; it
// is os.ErrDeadlineExceeded so errors.Is works with the standard library.
var ErrDeadline = os.ErrDeadlineExceeded

// IdleTimeoutError reports a connection that died of idleness (no
// keepalive answer). It is a *ConnError with CloseIdleTimeout.
func IdleTimeoutError() *ConnError {
	return &ConnError{Code: wire.CloseIdleTimeout, Reason: "idle timeout"}
}
