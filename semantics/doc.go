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
// This package imports no backend (ARCHITECTURE.md, layering rule).
package semantics
