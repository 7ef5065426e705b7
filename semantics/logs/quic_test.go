package logs_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	wlogs "forgeyard.dev/transport/wire/logs"
)

const quicServerName = "daemon.forgeyard.test"

// quicConns connects an agent and a daemon Conn over QUIC on loopback.
func quicConns(tb testing.TB, pki *trusttest.PKI, ln *quic.Listener) (agent, daemon *semantics.Conn) {
	tb.Helper()
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
	cfg := quic.Config{HandshakeTimeout: 5 * time.Second}
	bc, err := quic.Dialer{TLS: pki.ClientConfig(tb, wire.NewRunnerId(), quicServerName), Config: cfg}.Dial(ctx, ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	bs := <-acc
	if bs == nil {
		tb.Fatal("quic accept failed")
	}
	if agent, err = semantics.NewConn(bc, semantics.Config{}); err != nil {
		tb.Fatal(err)
	}
	if daemon, err = semantics.NewConn(bs, semantics.Config{}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = agent.CloseWithCode(wire.CloseNormal, "")
		_ = daemon.CloseWithCode(wire.CloseNormal, "")
	})
	return agent, daemon
}

func quicListener(tb testing.TB) (*trusttest.PKI, *quic.Listener) {
	tb.Helper()
	pki := trusttest.NewPKI(tb)
	ln, err := quic.Listen("127.0.0.1:0", pki.ServerConfig(tb, quicServerName), quic.Config{HandshakeTimeout: 5 * time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = ln.Close() })
	return pki, ln
}

// Over real QUIC on loopback: a compressed log with a spool, the
// connection closed mid-stream and the log resumed on a new connection
// from the daemon's durable point, into a FileSink.
func TestQUIC(t *testing.T) {
	ctx := testCtx(t)
	pki, ln := quicListener(t)
	sink, err := logs.NewFileSink(t.TempDir(), logs.FileSinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	f := newFixture(t, logs.Config{SpoolDir: t.TempDir(), Compress: true, MemoryLimit: 1 << 20},
		logs.ReceiverConfig{Sink: sink, AckBytes: 128 << 10})
	rng := rand.New(rand.NewPCG(8, 8))
	for n := 0; n < 4<<20; {
		p := logText(rng, 1+rng.IntN(32<<10))
		if rng.IntN(8) == 0 {
			p = randomBytes(rng, 1+rng.IntN(64<<10))
		}
		if err := f.write(wlogs.LogStreamKind(rng.IntN(3)), p); err != nil {
			t.Fatal(err)
		}
		n += len(p)
	}
	f.w.Close()

	// First connection: closed by the agent once 1 MiB is durable.
	agent, daemon := quicConns(t, pki, ln)
	srv := serveAll(ctx, daemon, f.r)
	att := make(chan error, 1)
	go func() { att <- f.w.Attach(ctx, agent, 0) }()
	for as, _ := f.r.Attempt(f.attempt); as.Bytes < 1<<20; as, _ = f.r.Attempt(f.attempt) {
		select {
		case <-f.acked:
		case err := <-att:
			t.Fatalf("Attach ended before the cut: %v", err)
		case <-ctx.Done():
			t.Fatal("no progress on the first connection")
		}
	}
	_ = agent.CloseWithCode(wire.CloseNormal, "reconnect")
	var ce *semantics.ConnError
	if err := <-att; !errors.As(err, &ce) {
		t.Fatalf("Attach after close: %v", err)
	}
	srv.wait()
	if st := f.w.Stats(); st.Acked == 0 || st.Acked == st.LastSeq {
		t.Fatalf("cut did not land mid-log: %+v", st)
	}

	// Second connection: resume from the durable point.
	agent, daemon = quicConns(t, pki, ln)
	srv = serveAll(ctx, daemon, f.r)
	go func() { att <- f.w.Attach(ctx, agent, sink.Durable(f.attempt)+1) }()
	fin := f.finalize(ctx)
	if err := <-att; err != nil {
		t.Fatal(err)
	}
	f.checkRecords(fileRecords(t, sink, f.attempt))
	if st := f.w.Stats(); fin.DroppedFrames != 0 || st.WireBytes >= st.RawBytesSent || st.Attaches != 2 {
		t.Fatalf("finalized %+v, stats %+v", fin, st)
	}
	_ = agent.CloseWithCode(wire.CloseNormal, "")
	srv.wait()
}
