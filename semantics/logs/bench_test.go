package logs_test

import (
	"context"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/internal/testkit/testbackends"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/wire"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// BenchmarkLogs measures log throughput agent → daemon (Writer → stream →
// Receiver → MemorySink{Discard}) next to the raw throughput of a log-kind
// stream on the same backend:
//
//	raw:    SendStream.Write of 64 KiB buffers, the reader discards
//	chunks: Writer.Write of 64 KiB log text (MiB/s)
//	flate:  the same with Compress (MiB/s of uncompressed log)
//	lines:  Writer.Write of one ~60-byte line per call (lines/s)
//
// go test ./semantics/logs -run '^$' -bench Logs -benchtime 2s
func BenchmarkLogs(b *testing.B) {
	for _, name := range testbackends.All {
		conns := func(b *testing.B) (*semantics.Conn, *semantics.Conn) {
			return testbackends.Conns(b, name, memory.Options{})
		}
		b.Run(name+"/raw", func(b *testing.B) { benchRaw(b, conns) })
		b.Run(name+"/chunks", func(b *testing.B) { benchLog(b, conns, false, false) })
		b.Run(name+"/flate", func(b *testing.B) { benchLog(b, conns, true, false) })
		b.Run(name+"/lines", func(b *testing.B) { benchLog(b, conns, false, true) })
	}
}

func benchRaw(b *testing.B, conns func(*testing.B) (*semantics.Conn, *semantics.Conn)) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	agent, daemon := conns(b)
	done := make(chan int64, 1)
	go func() {
		rs, err := daemon.AcceptUniStream(ctx)
		if err != nil {
			done <- -1
			return
		}
		n, _ := io.Copy(io.Discard, rs)
		done <- n
	}()
	s, err := agent.OpenUniStream(ctx, wire.StreamLog)
	if err != nil {
		b.Fatal(err)
	}
	buf := logText(rand.New(rand.NewPCG(1, 1)), 64<<10)
	b.SetBytes(1 << 20)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := 0; j < 16; j++ {
			if _, err := s.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	if n := <-done; n != int64(b.N)<<20 {
		b.Fatalf("read %d bytes", n)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "MiB/s")
}

func benchLog(b *testing.B, conns func(*testing.B) (*semantics.Conn, *semantics.Conn), compress, lines bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	agent, daemon := conns(b)
	f := newFixture(b, logs.Config{Compress: compress, MemoryLimit: 32 << 20},
		logs.ReceiverConfig{Sink: &logs.MemorySink{Discard: true}, MaxAttemptBytes: -1, AckBytes: 512 << 10, AckInterval: 5 * time.Millisecond})
	srv := serveAll(ctx, daemon, f.r)
	att := make(chan error, 1)
	go func() { att <- f.w.Attach(ctx, agent, 0) }()
	rng := rand.New(rand.NewPCG(2, 2))
	var chunk []byte
	var line [][]byte
	if lines {
		for i := 0; i < 1024; i++ {
			line = append(line, logText(rng, 40+rng.IntN(40)))
		}
		b.SetBytes(60)
	} else {
		chunk = logText(rng, 64<<10)
		b.SetBytes(1 << 20)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if lines {
			if i%8192 == 0 {
				// Backpressure for the benchmark producer (a real job's
				// output would be dropped and counted instead).
				if err := f.waitPending(ctx, 16<<20); err != nil {
					b.Fatal(err)
				}
			}
			if err := f.w.Write(wlogs.LogStdout, line[i%len(line)]); err != nil {
				b.Fatal(err)
			}
			continue
		}
		if err := f.waitPending(ctx, 16<<20); err != nil {
			b.Fatal(err)
		}
		for j := 0; j < 16; j++ {
			if err := f.w.Write(wlogs.LogStdout, chunk); err != nil {
				b.Fatal(err)
			}
		}
	}
	fin := f.w.FinalizedMessage()
	go func() {
		ack, err := f.r.Finalized(ctx, &fin)
		if err == nil {
			f.w.HandleFinalizedAck(&ack)
		}
	}()
	if err := f.w.Finalize(ctx, func(*wlogs.LogsFinalizedV1) error { return nil }); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if err := <-att; err != nil {
		b.Fatal(err)
	}
	st := f.w.Stats()
	if st.DroppedBytes != 0 {
		b.Fatalf("dropped %d bytes", st.DroppedBytes)
	}
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(st.RawBytesSent)/(1<<20)/sec, "MiB/s")
	if lines {
		b.ReportMetric(float64(b.N)/sec, "lines/s")
	}
	b.ReportMetric(float64(st.FramesSent)/sec, "frames/s")
	if compress {
		b.ReportMetric(100*float64(st.WireBytes)/float64(st.RawBytesSent), "wire%")
	}
	_ = agent.CloseWithCode(wire.CloseNormal, "")
	srv.wait()
}
