package webtransport

import (
	"context"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/backendtest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// BenchmarkControlUnderBulk measures 64-byte control round trips over
// semantics.Conn on this backend while one CAS stream saturates the
// session (backendtest.MeasureControlUnderBulk; b.N pings, at least 200).
func BenchmarkControlUnderBulk(b *testing.B) {
	c, s := oursPair(b, Config{})
	r := backendtest.MeasureControlUnderBulk(b, c, s, max(b.N, 200))
	b.ReportMetric(float64(r.IdleP50.Microseconds()), "idle-p50-µs")
	b.ReportMetric(float64(r.IdleP99.Microseconds()), "idle-p99-µs")
	b.ReportMetric(float64(r.P50.Microseconds()), "p50-µs")
	b.ReportMetric(float64(r.P99.Microseconds()), "p99-µs")
	b.ReportMetric(r.BulkMBps, "bulk-MB/s")
	b.ReportMetric(0, "ns/op")
}

func oursPair(tb testing.TB, cfg Config) (client, server *semantics.Conn) {
	tb.Helper()
	pki := trusttest.NewPKI(tb)
	ln, err := Listen("127.0.0.1:0", pki.ServerConfig(tb, serverName), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acc := make(chan semantics.BackendConn, 1)
	go func() {
		c, err := ln.Accept(ctx)
		if err != nil {
			acc <- nil
			return
		}
		acc <- c
	}()
	bc, err := Dialer{TLS: pki.ClientConfig(tb, wire.NewRunnerId(), serverName), Config: cfg}.Dial(ctx, ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	bs := <-acc
	if bs == nil {
		tb.Fatal("accept failed")
	}
	if client, err = semantics.NewConn(bc, semantics.Config{}); err != nil {
		tb.Fatal(err)
	}
	if server, err = semantics.NewConn(bs, semantics.Config{}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = client.CloseWithCode(wire.CloseNormal, "")
		_ = server.CloseWithCode(wire.CloseNormal, "")
	})
	return client, server
}
