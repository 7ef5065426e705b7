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
// checked by internal/testkit/deptest).
//
// # The map of semantics/
//
// Every package under semantics/, what kind of room it is, what it may
// import of this module and who uses it. Kinds: contract (the
// transport-neutral layer described above), identity (TLS and RunnerId), telemetry
// (Prometheus and OpenTelemetry behind the observers), helper (semantics'
// own internal packages), store (durable state and objects), data path
// (log and CAS streams with resume), engine (a peer role a host program
// embeds), test kit (shared conformance suites and fixtures, imported by
// tests).
//
//	| package | kind | may import | used by |
//	| --- | --- | --- | --- |
//	| `semantics` | contract | `wire/...` | backends, relay, every engine, data path and command |
//	| `semantics/session` | contract | `wire/...` | semantics/daemon, semantics/agent, semantics/signer |
//	| `semantics/control` | contract | `wire/...`, contract | semantics/daemon, semantics/agent, cmd/forgeyard-agent |
//	| `semantics/trust` | identity | `wire/...`, helper | engines, backends/backendtest, commands, internal/setup, internal/config |
//	| `semantics/trust/trusttest` | test kit | `wire/...`, `semantics/trust` | tests of backends, relay, engines and setup |
//	| `semantics/telemetry` | telemetry | `wire/...`, contract, helper, `semantics/telemetry/tablecell` | engines, data paths, commands, internal/setup, internal/adminapi |
//	| `semantics/telemetry/authmetrics` | telemetry | `wire/...`, `semantics/telemetry`, `semantics/authority` | cmd/forgeyard-daemon |
//	| `semantics/telemetry/tablecell` | telemetry | — | semantics/telemetry, commands, internal/doctor, internal/tools/loadgen |
//	| `semantics/internal/tokenbucket` | helper | — | semantics/daemon, data paths, semantics/telemetry |
//	| `semantics/ratemeter` | helper | — | semantics/daemon, backends/quic |
//	| `semantics/internal/atomicfile` | helper | — | semantics/logs, semantics/cas, semantics/objstore, semantics/trust |
//	| `semantics/internal/probe` | helper | `semantics/objstore` | semantics/logs, semantics/cas |
//	| `semantics/internal/pairkey` | helper | — | semantics/logs, semantics/cas |
//	| `semantics/authority` | store | `wire/...` | semantics/daemon, authmetrics, internal/setup, cmd/forgeyard-daemon, cmd/forgeyard |
//	| `semantics/authority/authoritytest` | test kit | `wire/...`, `semantics/authority` | tests of semantics/authority (SQLite, PostgreSQL) |
//	| `semantics/objstore` | store | helper | data paths, semantics/daemon, s3store, internal/setup |
//	| `semantics/objstore/s3store` | store | `semantics/objstore` | internal/setup, internal/testkit/s3test |
//	| `semantics/objstore/objstoretest` | test kit | `semantics/objstore` | tests of objstore and s3store |
//	| `semantics/retention` | store | `wire/...`, data path | semantics/daemon |
//	| `semantics/logs` | data path | `wire/...`, contract, helper, `semantics/objstore`, `semantics/telemetry` | semantics/daemon, semantics/agent, retention, internal/setup |
//	| `semantics/logs/logstest` | test kit | `wire/...`, `semantics/logs` | tests of logs and s3store |
//	| `semantics/cas` | data path | `wire/...`, contract, helper, `semantics/objstore`, `semantics/telemetry` | engines, retention, internal/setup |
//	| `semantics/cas/castest` | test kit | `wire/...`, `semantics/cas` | tests of cas, s3store, retention, daemonsetup |
//	| `semantics/daemon` | engine | `wire/...`, contract, identity, data path, helper, `semantics/authority`, `semantics/objstore`, `semantics/retention`, `semantics/telemetry` | cmd/forgeyard-daemon, internal/setup, internal/demoscheduler, internal/testkit/enginetest |
//	| `semantics/agent` | engine | `wire/...`, contract, identity, data path, `semantics/telemetry` | cmd/forgeyard-agent, semantics/signer, semantics/deviceagent, internal/setup, internal/tools/loadgen |
//	| `semantics/signer` | engine | `wire/...`, contract, `semantics/agent` | cmd/forgeyard-signer, cmd/forgeyard-demo |
//	| `semantics/deviceagent` | engine | `wire/...`, contract, data path, `semantics/agent` | cmd/forgeyard-demo |
//
// The "may import" column names kinds (every package of that kind) and
// packages (`wire/...` is wire and everything under it); "—" is nothing of
// this module. It covers non-test imports of forgeyard.dev/transport/...
// only, and whatever it says, nothing under semantics/ imports the module's
// internal/ (semantics/internal/... is semantics' own). The "used by" column
// is descriptive. internal/testkit/deptest (TestSemanticsMap) reads this table from
// this comment: every package under semantics/ has a row, every row is a
// package, every import obeys its row, and docs/architecture.md carries the
// same lines.
package semantics
