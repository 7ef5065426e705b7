// Package memory is the in-process backend: pairs of semantics.BackendConn
// joined by Go memory instead of sockets, for tests and demos (§169–170).
//
// Streams behave like QUIC streams: bounded per-stream buffers give real
// flow control (Write blocks while the peer does not read), Close sends a
// FIN after the buffered data, CancelWrite and CancelRead carry their codes
// to the peer, deadlines end blocked calls with os.ErrDeadlineExceeded, and
// CloseWithCode is seen by the peer with the same code and reason.
//
// TLS semantics without TLS bytes: a Dialer and a Listener each take a
// *tls.Config, and the in-memory handshake verifies certificate chains with
// x509.Verify exactly as crypto/tls would (validity period, CA, server name,
// client certificate required/verified, VerifyPeerCertificate and
// VerifyConnection callbacks, ALPN), then fills tls.ConnectionState
// (Version TLS 1.3, PeerCertificates, VerifiedChains, NegotiatedProtocol).
//
// Fault injection (Options): one-way latency per write, bandwidth per
// direction, a cut after N bytes or N writes, and Conn.Disconnect. A cut is a
// network failure, not a close: both ends see a *semantics.ConnError with
// Code wire.CloseIdleTimeout, Remote false and Reason CutReason — what a
// real backend reports when the path disappears and the idle timeout fires.
//
// Addresses are names in a Network (an in-process registry); DefaultNetwork
// serves NewListener and a Dialer with a nil Network.
package memory
