package semantics_test

import (
	"context"
	"io"
	"testing"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
)

// BenchmarkFrameRoundTripMetrics measures the cost Config.Metrics adds to
// the stream hot path (bytes, queue depth): 1 KiB control frames written
// and read back over a memory pipe, with metrics off (nil) and on.
func BenchmarkFrameRoundTripMetrics(b *testing.B) {
	for _, bc := range []struct {
		name string
		m    *telemetry.Metrics
	}{{"off", nil}, {"on", telemetry.NewMetrics()}} {
		b.Run(bc.name, func(b *testing.B) {
			cc, sc := memory.Pipe(memory.Options{})
			c, err := semantics.NewConn(cc, semantics.Config{Metrics: bc.m})
			if err != nil {
				b.Fatal(err)
			}
			s, err := semantics.NewConn(sc, semantics.Config{Metrics: bc.m})
			if err != nil {
				b.Fatal(err)
			}
			defer c.CloseWithCode(wire.CloseNormal, "")
			defer s.CloseWithCode(wire.CloseNormal, "")
			ctx := context.Background()
			out, err := c.OpenStream(ctx, wire.StreamControl)
			if err != nil {
				b.Fatal(err)
			}
			in, err := s.AcceptStream(ctx)
			if err != nil {
				b.Fatal(err)
			}
			body := make([]byte, 1024)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if err := out.WriteFrame(func(p []byte) []byte { return append(p, body...) }); err != nil {
					b.Fatal(err)
				}
				if _, err := in.ReadFrame(); err != nil && err != io.EOF {
					b.Fatal(err)
				}
			}
		})
	}
}
