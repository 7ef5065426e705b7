package backendtest

import "testing"

// RunBenchmarks runs the backend benchmarks against f: 64-byte control
// round trips on a long-lived stream, bulk throughput on 1 and 4 streams,
// and control round-trip percentiles while one bulk stream saturates the
// connection. Each runs over the raw BackendConn ("raw") and over
// semantics.Conn ("ours").
func RunBenchmarks(b *testing.B, f Factory) {
	b.Skip("backendtest: benchmarks land in the next commit")
}

// IdleConnMemory opens n idle connections (semantics.Conn over f on both
// sides), then reports the server-side Go heap per connection (after GC)
// and the process RSS delta per connection, via t.Logf and as return
// values (bytes).
func IdleConnMemory(t testing.TB, f Factory, n int) (heapPerConn, rssPerConn float64) {
	t.Skip("backendtest: IdleConnMemory lands in the next commit")
	return 0, 0
}
