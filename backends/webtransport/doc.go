// Package webtransport is the WebTransport backend of Forgeyard Transport
// (ARCHITECTURE.md decisions 8 and 11): webtransport-go v0.13.0 over HTTP/3
// (quic-go v0.64.1; the two are pinned together), served at the well-known
// path /.well-known/forgeyard/agent, UDP 443 in production. It helps where
// only UDP 443 passes; it does not help where UDP is blocked.
//
// One WebTransport session per QUIC connection is one semantics.BackendConn:
//
//   - The application protocol "forgeyard/1" is negotiated with
//     WT-Available-Protocols/WT-Protocol (TLS ALPN is "h3"); both sides
//     reject a session that did not select it.
//   - CloseWithCode closes the session with SessionErrorCode =
//     uint32(CloseCode) and the reason as the WT_CLOSE_SESSION message, and
//     then closes the QUIC connection with the same application error code
//     and reason, so the peer learns the code from whichever arrives first.
//   - Stream resets carry webtransport StreamErrorCode = uint32(code).
//   - Peer certificates come from the QUIC connection's TLS state.
//   - Errors are translated in exactly one place (errors.go), on top of
//     backends/quic's translation of QUIC-level errors.
//
// QUIC settings (keepalive, idle timeout, windows, stream credit, budget,
// logger) are those of backends/quic's Config; Listen and Dial add the
// few streams HTTP/3 itself needs to the stream credit.
package webtransport
