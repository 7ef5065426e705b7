// Package deptest holds the tests that pin the layering rule of
// ARCHITECTURE.md on the module's import graph (in the spirit of Tailscale's
// tstest/deptest); it is the one copy of that rule (`make layering` runs it).
// TestLayering: wire imports nothing of semantics, backends, relay or cmd;
// semantics imports no backend and nothing of the module's internal/
// (semantics/internal/... is its own); only backends/quic and
// backends/webtransport import quic-go; only backends/yamux imports yamux;
// only semantics/objstore/s3store imports the S3 SDK. TestSemanticsMap pins
// the map of semantics/ (the table in semantics/doc.go's package comment,
// kept equal to docs/architecture.md's): every package under semantics/ has
// a row, every row is a package, and each package's non-test imports of the
// module obey its "may import" cell. TestContractDeps pins the pure
// contract: semantics, semantics/session and semantics/control import only
// wire, the standard library and golang.org/x, and neither they nor any
// backend link Prometheus, the OpenTelemetry SDK, semantics/telemetry, an SQL
// driver or an engine.
package deptest
