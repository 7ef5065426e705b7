// Package enginebench holds benchmarks of the protocol engine
// (semantics/daemon and semantics/agent) over real backends; it has no
// non-test code.
//
// BenchmarkLeaseLatency runs sequential lease lifecycles between one daemon
// and one agent per backend (memory, quic, yamux, webtransport) with an
// executor that returns at once, and reports:
//
//   - offer-accept p50/p99: the host's daemon.OfferLease call (authority
//     CreateLease, LeaseOfferV1 out, LeaseAcceptedV1 back, AcceptLease);
//   - compl-ack p50/p99: at the agent, from the executor's return to the
//     CompletionAckV1 (encode, send, authority CompleteAttempt, ack back);
//   - raw-rtt p50: a 64-byte ping-pong on a plain semantics stream over
//     the same backend in the same run, so the engine's cost reads as a
//     ratio to the transport round trip.
//
// The authority is SQLite in memory so that the numbers are the
// transport's and the engine's, not the disk's.
//
// BenchmarkCompletionThroughput drives one daemon with 8 agents over the
// memory backend (8 attempts in flight each) and reports completions per
// second with a file-backed SQLite authority and with PostgreSQL
// (internal/testkit/pgtest).
//
// Results and the exact command are in docs/perf/engine.md.
package enginebench
