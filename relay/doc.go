// Package relay is the core of forgeyard-relay (ARCHITECTURE.md decision
// 10): it accepts agents over TLS+yamux or WebTransport (any
// semantics.BackendListener) and, for each agent connection, opens one QUIC
// connection to a daemon, copying streams one-to-one in both directions.
// docs/protocols/internal/relay.md is the reference; in short:
//
//   - Upstream: Config.Upstreams are tried in order, each dial bounded by
//     Config.DialTimeout; the first that completes the QUIC handshake
//     carries the agent. If none does, the agent is closed with
//     wire.CloseShutdown ("reconnect elsewhere"), or with the daemon's own
//     close code if a daemon refused the relay.
//   - Streams: every stream either side opens (bidirectional or
//     unidirectional) is accepted, its StreamHeader frame (§40) read and
//     forwarded verbatim, a stream of the same direction type opened on the
//     other side, and bytes copied raw; the relay parses nothing but the
//     header. A FIN becomes a FIN (half-close), a reset (RESET_STREAM)
//     becomes a reset with the same code, and a STOP_SENDING becomes a
//     STOP_SENDING with the same code (observed when the relay next writes
//     to the stopped stream, which a sender that keeps writing triggers at
//     once).
//   - Priorities: the header's kind gives the stream's class
//     (semantics.DefaultPriority). Control-class writes never wait; bulk
//     streams (log, CAS) write chunks of DefaultBulkChunk bytes after
//     pending control writes and, towards a backend implementing
//     semantics.BulkHinter (yamux), while its queue is above
//     Config.BulkQueueThreshold (each wait bounded by Config.BulkMaxWait).
//   - Close codes: when either side closes, the relay finishes forwarding
//     what it already read from it (bounded by Config.CloseGrace) and
//     closes the other side with the same CloseCode and reason, so an
//     agent sees the daemon's GoAway/Shutdown code and the daemon sees the
//     agent's. A failure the relay detects itself (idle timeout) keeps its
//     code with a "relay: " reason.
//   - Limits: Config.MaxConns agent connections (beyond it: closed with
//     wire.CloseOverloaded); Config.MaxStreamsPerConn streams in flight per
//     connection (beyond it: the stream is reset with
//     semantics.StreamRefused, the connection and other agents unharmed);
//     each stream direction copies through one Config.CopyBuffer buffer, so
//     a connection holds at most 2 × MaxStreamsPerConn × CopyBuffer bytes
//     in the relay (plus the backends' own bounded receive windows). Give
//     an agent-facing TLS+yamux listener DefaultAgentStreamWindow (2 MiB,
//     forgeyard-relay's limits.stream_window) rather than the backend's
//     16 MiB: a stream the relay forwards more slowly than the agent sends
//     backs up in hashicorp/yamux's per-stream receive buffer, which then
//     grows to about twice the window and reallocates as it does.
//   - Trust: the relay authenticates agents with mTLS on its listeners and
//     itself to the daemon with a certificate that names no runner; it
//     cannot register as a runner because registration needs a signature
//     by the runner's key over a daemon challenge bound to the transport
//     session (RegisterAgentV1.key_proof).
//   - Metrics: forgeyard_relay_* (see metrics.go) on Config.Registerer.
//
// Embedding (tests, netns scenarios, the demo):
//
//	r, err := relay.New(relay.Config{Upstreams: []string{"127.0.0.1:7443"}, UpstreamTLS: tlsToDaemon})
//	ln, err := yamux.Listen("127.0.0.1:0", agentFacingTLS, yamux.Config{MaxStreamWindow: relay.DefaultAgentStreamWindow})
//	go r.Serve(ctx, ln)
//	...
//	r.Shutdown(ctx) // closes ln and every relayed connection (CloseShutdown)
package relay
