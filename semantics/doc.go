// Package semantics is the transport-neutral contract of Forgeyard Transport:
// connections, streams by kind, priorities, close codes and limits, written
// once and run unchanged over every backend (QUIC, WebTransport, TLS+yamux,
// in-memory).
//
// Two levels:
//
//   - Backends implement the small raw interfaces in backend.go
//     (BackendConn, BackendListener, BackendDialer): reliable byte streams,
//     stream resets with codes, connection close with a CloseCode, TLS state.
//     They translate their library's errors into *StreamError and
//     *ConnError in exactly one place.
//   - Everything above a backend uses *Conn (conn.go), which wraps a
//     BackendConn and adds the stream header (§40), stream kinds, per-kind
//     limits enforced on both sides (§133, §275), the priority write
//     scheduler (§45–49, §132) and uniform close-code behaviour (§102–103).
//
// Metrics reach the contract through observers (observer.go),
// interfaces of hooks in the spirit of quic-go's logging.ConnectionTracer:
// Config.Metrics is an Observer (streams opened and closed, bytes in and
// out by StreamKind, write-queue depth by WriteClass) and
// control.Config.Metrics a MessageObserver (messages by wire.Family and
// Outcome, protocol errors by code). semantics/telemetry's *Metrics
// implements both and maps these closed sets to its label strings; a nil
// observer, or a nil pointer stored in one, means no hook is called.
// Tracing crosses the contract as plain wire.TraceContext values in the
// envelope (control.Out.Trace), which semantics/telemetry builds and reads.
//
// This package, semantics/session and semantics/control import only wire,
// the standard library and golang.org/x: no backend, no metrics or
// tracing library, no storage, no engine (ARCHITECTURE.md, layering rule;
// checked by internal/deptest).
package semantics
