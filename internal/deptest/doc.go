// Package deptest holds the test that pins the layering rule of
// ARCHITECTURE.md on the module's import graph (in the spirit of Tailscale's
// tstest/deptest): wire imports nothing of semantics, backends, relay or cmd;
// semantics imports no backend; only backends/quic and backends/webtransport
// import quic-go; only backends/yamux imports yamux. TestContractDeps pins
// the pure contract: semantics, semantics/session and semantics/control import
// only wire, the standard library and golang.org/x, and neither they nor any
// backend link Prometheus, the OpenTelemetry SDK, semantics/telemetry, an SQL
// driver or an engine.
package deptest
