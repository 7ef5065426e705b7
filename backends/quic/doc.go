// Package quic is the native QUIC backend of Forgeyard Transport
// (ARCHITECTURE.md decision 8): quic-go, TLS 1.3 only, ALPN "forgeyard/1",
// UDP 7443 in production.
//
// It implements the raw contract of package semantics (BackendConn,
// RawStream, BackendListener, BackendDialer) as thin adapters over quic-go's
// concrete *quic.Conn and *quic.Stream. Everything above the raw contract
// (stream header, kinds, per-kind limits, the priority scheduler) lives in
// semantics.Conn and is the same on every backend.
//
// Codes: a connection closed with a semantics.CloseCode is closed with the
// QUIC application error code uint64(CloseCode) and the reason as the
// CONNECTION_CLOSE reason phrase; a stream reset or STOP_SENDING carries
// uint64(semantics.StreamErrorCode). quic-go errors are translated into
// *semantics.ConnError and *semantics.StreamError in exactly one place
// (errors.go); the original quic-go error stays in the chain (errors.As
// finds both).
//
// Stream limits: quic-go enforces MaxIncomingStreams/MaxIncomingUniStreams
// with QUIC stream credit (MAX_STREAMS). A peer at that limit cannot open a
// stream at all: its OpenStream blocks until a stream completes or its ctx
// is done; nothing reaches the receiver. semantics.Conn's per-kind limits
// (Limits.MaxStreamsPerKind, MaxStreams) are enforced after the stream
// header is read, with a StreamRefused reset and a refusal count. To keep
// the semantic refusal observable (and the CloseLimitExceeded escalation
// reachable), the QUIC credit is set above the semantic limit:
// Config.WithLimits sets it to Limits.MaxStreams + Limits.MaxRefusals, which
// is also the zero-value default (256 + 16 = 272 each way).
//
// UDP buffers: quic-go wants 7 MiB socket buffers (v0.64.1,
// sys_conn_buffers_nonopenbsd.go) and logs with the standard log package
// when it cannot get them. This package replaces that message with ONE
// slog warning per process that names the fix
// ("sysctl -w net.core.rmem_max=7500000 net.core.wmem_max=7500000"): it sets
// QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING=true unless the variable is already
// set, and checks the real socket buffer sizes itself. UDPBufferAdvice
// reports the same condition for `forgeyard doctor`.
package quic
