package logs_test

import (
	"bytes"
	"compress/flate"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/wire"
	wlogs "forgeyard.dev/transport/wire/logs"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Frames arrive in order, kinds and bytes intact, sequence numbers 1..n,
// with the writer producing concurrently with the sender.
func TestOrderedDelivery(t *testing.T) {
	ctx := testCtx(t)
	agent, daemon := memConns(t, memory.Options{})
	f := newFixture(t, logs.Config{Epoch: 7}, logs.ReceiverConfig{})
	srv := serveAll(ctx, daemon, f.r)
	att := make(chan error, 1)
	go func() { att <- f.w.Attach(ctx, agent, 0) }()

	rng := rand.New(rand.NewPCG(1, 2))
	total := 0
	for i := 0; i < 3000; i++ {
		kind := wlogs.LogStreamKind(rng.IntN(3))
		p := logText(rng, 1+rng.IntN(300))
		if i%500 == 0 {
			p = logText(rng, 150<<10) // spans several chunks
		}
		if err := f.write(kind, p); err != nil {
			t.Fatal(err)
		}
		total += len(p)
	}
	fin := f.finalize(ctx)
	if err := <-att; err != nil {
		t.Fatalf("Attach: %v", err)
	}
	sink := f.sink.(*logs.MemorySink)
	f.checkRecords(sink.Records(f.attempt))
	st := f.w.Stats()
	if fin.TotalBytes != uint64(total) || fin.DroppedFrames != 0 || fin.LastSeq != st.LastSeq || st.Acked != st.LastSeq {
		t.Fatalf("finalized %+v, stats %+v, total %d", fin, st, total)
	}
	if st.PendingFrames != 0 || st.PendingBytes != 0 || st.MemoryBytes != 0 {
		t.Fatalf("pending data after finalize: %+v", st)
	}
	if rs := f.r.Stats(); rs.BytesAppended != int64(total) || rs.Duplicates != 0 || rs.Gaps != 0 {
		t.Fatalf("receiver stats %+v", rs)
	}
	if as, _ := f.r.Attempt(f.attempt); as.Epoch != 7 || as.Durable != st.LastSeq || as.Bytes != int64(total) {
		t.Fatalf("attempt state %+v", as)
	}
	_ = agent.CloseWithCode(wire.CloseNormal, "")
	srv.wait()
}

// Several seeded runs: the connection is cut after a random number of
// bytes, again and again, and once the daemon restarts (new Receiver and
// FileSink over the same directory). The sink ends up with exactly the
// bytes the writer was given: no gap, no duplicate.
func TestResumeAfterCuts(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run("seed"+string(rune('0'+seed)), func(t *testing.T) { testResumeAfterCuts(t, seed) })
	}
}

func testResumeAfterCuts(t *testing.T, seed uint64) {
	ctx := testCtx(t)
	rng := rand.New(rand.NewPCG(seed, 99))
	sinkDir := t.TempDir()
	sink, err := logs.NewFileSink(sinkDir, logs.FileSinkOptions{NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	spoolRoot := t.TempDir()
	f := newFixture(t, logs.Config{SpoolDir: spoolRoot, MemoryLimit: 128 << 10, SegmentSize: 256 << 10, Compress: seed%2 == 0},
		logs.ReceiverConfig{Sink: sink, AckBytes: 64 << 10})

	// The job writes 3 MiB in random pieces while the connection flaps.
	const total = 3 << 20
	wrote := make(chan error, 1)
	go func() {
		wrng := rand.New(rand.NewPCG(seed, 7))
		for n := 0; n < total; {
			p := logText(wrng, 1+wrng.IntN(20<<10))
			if wrng.IntN(10) == 0 {
				p = randomBytes(wrng, 1+wrng.IntN(70<<10))
			}
			if err := f.write(wlogs.LogStreamKind(wrng.IntN(3)), p); err != nil {
				wrote <- err
				return
			}
			n += len(p)
		}
		f.w.Close()
		wrote <- nil
	}()

	cuts, restarted := 0, false
	for conn := 0; ; conn++ {
		if conn > 300 {
			t.Fatal("log not delivered after 300 connections")
		}
		cut := int64(0)
		if conn < 12 {
			cut = 20<<10 + rng.Int64N(200<<10)
		}
		if conn == 4 && !restarted {
			// Daemon restart: unsynced appends are lost; the agent's
			// resend from the durable point fills them in exactly once.
			restarted = true
			if err := sink.Close(); err != nil {
				t.Fatal(err)
			}
			if sink, err = logs.NewFileSink(sinkDir, logs.FileSinkOptions{NoFsync: true}); err != nil {
				t.Fatal(err)
			}
			f.sink = sink
			f.r = f.newReceiver(logs.ReceiverConfig{AckBytes: 64 << 10})
		}
		agent, daemon := memConns(t, memory.Options{CutAfterBytes: cut})
		srv := serveAll(ctx, daemon, f.r)
		// The resume point is the daemon's durable sequence + 1, as its
		// LogAck/LogResumeRequest would carry.
		from := sink.Durable(f.attempt) + 1
		err := f.w.Attach(ctx, agent, from)
		_ = agent.CloseWithCode(wire.CloseNormal, "")
		_ = daemon.CloseWithCode(wire.CloseNormal, "")
		srv.wait()
		if err == nil {
			break
		}
		var ce *semantics.ConnError
		if !errors.As(err, &ce) {
			t.Fatalf("Attach on connection %d: %v", conn, err)
		}
		cuts++
	}
	if err := <-wrote; err != nil {
		t.Fatalf("writer: %v", err)
	}
	// The last stream ended; finalize on a clean connection (the barrier
	// also covers frames whose ack the cut lost).
	agent, daemon := memConns(t, memory.Options{})
	serveAll(ctx, daemon, f.r)
	att := make(chan error, 1)
	go func() { att <- f.w.Attach(ctx, agent, sink.Durable(f.attempt)+1) }()
	fin := f.finalize(ctx)
	if err := <-att; err != nil {
		t.Fatal(err)
	}
	if cuts < 5 {
		t.Fatalf("only %d cuts happened", cuts)
	}
	st := f.w.Stats()
	if fin.DroppedFrames != 0 || fin.TotalBytes < total || st.FramesResent == 0 {
		t.Fatalf("finalized %+v, stats %+v", fin, st)
	}
	f.checkRecords(fileRecords(t, sink, f.attempt))
	if _, err := os.Stat(filepath.Join(spoolRoot, f.attempt.String())); err == nil {
		t.Fatal("spool directory left after finalize")
	}
	_ = sink.Close()
}

// Nothing is attached: the log goes to the spool (memory stays within its
// limit); after the connection comes, everything drains in order.
func TestSpoolWhileDisconnected(t *testing.T) {
	ctx := testCtx(t)
	spoolRoot := t.TempDir()
	const memLimit = 64 << 10
	f := newFixture(t, logs.Config{SpoolDir: spoolRoot, MemoryLimit: memLimit, SegmentSize: 128 << 10}, logs.ReceiverConfig{})
	rng := rand.New(rand.NewPCG(3, 3))
	const total = 2 << 20
	for n := 0; n < total; {
		p := logText(rng, 1+rng.IntN(8<<10))
		if err := f.write(wlogs.LogStreamKind(rng.IntN(2)), p); err != nil {
			t.Fatal(err)
		}
		n += len(p)
	}
	st := f.w.Stats()
	if st.MemoryBytes > memLimit+wlogs.MaxLogChunk || st.SpoolDiskBytes < total-memLimit-wlogs.MaxLogChunk || st.PendingBytes < total {
		t.Fatalf("disconnected: %+v", st)
	}
	segs, _ := os.ReadDir(filepath.Join(spoolRoot, f.attempt.String()))
	if len(segs) < 10 {
		t.Fatalf("%d spool segments for 2 MiB, want ≥ 10", len(segs))
	}

	agent, daemon := memConns(t, memory.Options{})
	srv := serveAll(ctx, daemon, f.r)
	att := make(chan error, 1)
	go func() { att <- f.w.Attach(ctx, agent, 0) }()
	fin := f.finalize(ctx)
	if err := <-att; err != nil {
		t.Fatal(err)
	}
	f.checkRecords(f.sink.(*logs.MemorySink).Records(f.attempt))
	if fin.DroppedFrames != 0 {
		t.Fatalf("finalized %+v", fin)
	}
	if st := f.w.Stats(); st.SpoolDiskBytes != 0 || st.MemoryBytes != 0 {
		t.Fatalf("after finalize: %+v", st)
	}
	if _, err := os.Stat(filepath.Join(spoolRoot, f.attempt.String())); !os.IsNotExist(err) {
		t.Fatalf("spool directory after finalize: %v", err)
	}
	_ = agent.CloseWithCode(wire.CloseNormal, "")
	srv.wait()
}

// The cap is hit while disconnected: new writes are dropped whole,
// counted in Stats and in LogsFinalizedV1, and everything accepted arrives.
func TestCapDropsAreCounted(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  logs.Config
		cap  int64
	}{
		{"memory", logs.Config{MemoryLimit: 256 << 10}, 256 << 10},
		{"spool", logs.Config{MemoryLimit: 32 << 10, SpoolLimit: 512 << 10}, 512 << 10},
		{"frames", logs.Config{MaxPendingFrames: 100, ChunkSize: 1 << 10}, 100 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			if tc.name == "spool" {
				tc.cfg.SpoolDir = t.TempDir()
			}
			f := newFixture(t, tc.cfg, logs.ReceiverConfig{})
			rng := rand.New(rand.NewPCG(4, 4))
			var dropped, droppedFrames, total uint64
			chunk := uint64(wlogs.MaxLogChunk)
			if tc.cfg.ChunkSize != 0 {
				chunk = uint64(tc.cfg.ChunkSize)
			}
			for i := 0; i < 400; i++ {
				p := logText(rng, 1+rng.IntN(4<<10))
				total += uint64(len(p))
				switch err := f.write(wlogs.LogStdout, p); {
				case errors.Is(err, logs.ErrDropped):
					dropped += uint64(len(p))
					droppedFrames += (uint64(len(p)) + chunk - 1) / chunk
				case err != nil:
					t.Fatal(err)
				}
			}
			st := f.w.Stats()
			if dropped == 0 || st.DroppedBytes != dropped || st.DroppedFrames != droppedFrames || st.TotalBytes != total {
				t.Fatalf("dropped %d bytes/%d frames, stats %+v", dropped, droppedFrames, st)
			}
			if st.PendingBytes > tc.cap || st.MemoryBytes > max(tc.cap, tc.cfg.MemoryLimit) {
				t.Fatalf("over the cap: %+v", st)
			}
			agent, daemon := memConns(t, memory.Options{})
			srv := serveAll(ctx, daemon, f.r)
			att := make(chan error, 1)
			go func() { att <- f.w.Attach(ctx, agent, 0) }()
			fin := f.finalize(ctx)
			if err := <-att; err != nil {
				t.Fatal(err)
			}
			if fin.DroppedBytes != dropped || fin.DroppedFrames != droppedFrames || fin.TotalBytes != total {
				t.Fatalf("LogsFinalizedV1 %+v, want dropped %d/%d of %d", fin, droppedFrames, dropped, total)
			}
			if err := fin.Validate(); err != nil {
				t.Fatal(err)
			}
			f.checkRecords(f.sink.(*logs.MemorySink).Records(f.attempt))
			_ = agent.CloseWithCode(wire.CloseNormal, "")
			srv.wait()
		})
	}
}

// Flate streams: compressible text shrinks on the wire, random data is
// sent as stored blocks (still within MaxLogChunk), and both round-trip.
func TestCompressionRoundTrip(t *testing.T) {
	ctx := testCtx(t)
	agent, daemon := memConns(t, memory.Options{})
	f := newFixture(t, logs.Config{Compress: true}, logs.ReceiverConfig{})
	srv := serveAll(ctx, daemon, f.r)
	rng := rand.New(rand.NewPCG(5, 5))
	for i := 0; i < 20; i++ {
		if err := f.write(wlogs.LogStdout, logText(rng, 100<<10)); err != nil {
			t.Fatal(err)
		}
		if err := f.write(wlogs.LogStderr, randomBytes(rng, 70<<10)); err != nil {
			t.Fatal(err)
		}
	}
	att := make(chan error, 1)
	go func() { att <- f.w.Attach(ctx, agent, 0) }()
	f.finalize(ctx)
	if err := <-att; err != nil {
		t.Fatal(err)
	}
	f.checkRecords(f.sink.(*logs.MemorySink).Records(f.attempt))
	st := f.w.Stats()
	// 2 MB text compresses well; 1.4 MB random costs a few bytes per chunk.
	if st.WireBytes >= st.RawBytesSent*7/10 || st.RawBytesSent != 20*(170<<10) {
		t.Fatalf("wire %d bytes for %d raw", st.WireBytes, st.RawBytesSent)
	}
	_ = agent.CloseWithCode(wire.CloseNormal, "")
	srv.wait()
}

// rawStream opens a log stream by hand and sends the header.
func rawStream(t *testing.T, agent *semantics.Conn, hdr *wlogs.LogStreamHeaderV1) *semantics.SendStream {
	t.Helper()
	s, err := agent.OpenUniStream(testCtx(t), wire.StreamLog)
	if err != nil {
		t.Fatal(err)
	}
	if hdr != nil {
		if err := s.WriteEnvelope(&wire.Envelope{Protocol: wire.Current, MessageID: wire.NewMessageId(), Payload: hdr}); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func sendFrame(t *testing.T, s *semantics.SendStream, m wire.Message) {
	t.Helper()
	if err := s.WriteEnvelope(&wire.Envelope{Protocol: wire.Current, MessageID: wire.NewMessageId(), Payload: m}); err != nil {
		t.Fatal(err)
	}
}

func wantReject(t *testing.T, srv *server, reason logs.RejectReason, code semantics.StreamErrorCode) *logs.RejectError {
	t.Helper()
	select {
	case err := <-srv.errs:
		var re *logs.RejectError
		if !errors.As(err, &re) || re.Reason != reason || re.Code != code {
			t.Fatalf("Serve: %v, want reject %s/%s", err, reason, code)
		}
		return re
	case <-time.After(testTimeout):
		t.Fatal("Serve did not return")
	}
	return nil
}

// Malformed headers and frames, a compression bomb, an unauthorized lease
// and a sequence gap each reset only their stream with a typed reason; the
// receiver then serves a good stream on the same connection.
func TestRejectsAndSurvives(t *testing.T) {
	ctx := testCtx(t)
	agent, daemon := memConns(t, memory.Options{})
	f := newFixture(t, logs.Config{}, logs.ReceiverConfig{})
	srv := serveAll(ctx, daemon, f.r)
	hdr := func(first uint64, enc wlogs.LogEncoding) *wlogs.LogStreamHeaderV1 {
		return &wlogs.LogStreamHeaderV1{Attempt: f.attempt, Lease: f.lease, FirstSeq: first, Encoding: enc}
	}

	// Garbage instead of a header.
	s := rawStream(t, agent, nil)
	if err := s.WriteFrame(func(b []byte) []byte { return append(b, 0xff, 0xff, 0xff) }); err != nil {
		t.Fatal(err)
	}
	wantReject(t, srv, logs.RejectBadHeader, semantics.StreamProtocolError)

	// A frame where the header belongs.
	s = rawStream(t, agent, nil)
	sendFrame(t, s, &wlogs.LogFrameV1{Seq: 1, Bytes: []byte("x"), UncompressedLen: 1})
	wantReject(t, srv, logs.RejectBadHeader, semantics.StreamProtocolError)

	// Wrong lease.
	bad := hdr(1, wlogs.LogEncodingRaw)
	bad.Lease = wire.NewLeaseId()
	rawStream(t, agent, bad)
	wantReject(t, srv, logs.RejectUnauthorized, semantics.StreamForbidden)

	// Gap: nothing is stored, the stream starts at 5; a resume request
	// names 1.
	rawStream(t, agent, hdr(5, wlogs.LogEncodingRaw))
	if re := wantReject(t, srv, logs.RejectGap, semantics.StreamProtocolError); re.NextSeq != 1 {
		t.Fatalf("gap NextSeq %d", re.NextSeq)
	}
	if m := <-f.resumes; m.Attempt != f.attempt || m.FromSeq != 1 {
		t.Fatalf("resume request %+v", m)
	}

	// A frame that is not a LogFrameV1 after a good header.
	s = rawStream(t, agent, hdr(1, wlogs.LogEncodingRaw))
	sendFrame(t, s, hdr(1, wlogs.LogEncodingRaw))
	wantReject(t, srv, logs.RejectBadFrame, semantics.StreamProtocolError)

	// Raw length mismatch.
	s = rawStream(t, agent, hdr(1, wlogs.LogEncodingRaw))
	sendFrame(t, s, &wlogs.LogFrameV1{Seq: 1, Bytes: []byte("abc"), UncompressedLen: 9})
	wantReject(t, srv, logs.RejectPayload, semantics.StreamProtocolError)

	// Compression bomb: a few KiB of DEFLATE that inflate to 4 MiB,
	// declared as 1000 bytes.
	var bomb bytes.Buffer
	zw, _ := flate.NewWriter(&bomb, flate.BestSpeed)
	_, _ = zw.Write(make([]byte, 4<<20))
	_ = zw.Close()
	s = rawStream(t, agent, hdr(1, wlogs.LogEncodingFlate))
	sendFrame(t, s, &wlogs.LogFrameV1{Seq: 1, Bytes: bomb.Bytes(), UncompressedLen: 1000})
	re := wantReject(t, srv, logs.RejectPayload, semantics.StreamProtocolError)
	var pe *wlogs.PayloadError
	if !errors.As(re, &pe) || pe.Reason != wlogs.PayloadOverflow {
		t.Fatalf("bomb: %v", re)
	}

	// Sequence going backwards inside a stream.
	s = rawStream(t, agent, hdr(1, wlogs.LogEncodingRaw))
	sendFrame(t, s, &wlogs.LogFrameV1{Seq: 1, Bytes: []byte("a"), UncompressedLen: 1})
	sendFrame(t, s, &wlogs.LogFrameV1{Seq: 1, Bytes: []byte("a"), UncompressedLen: 1})
	wantReject(t, srv, logs.RejectBadFrame, semantics.StreamProtocolError)
	// Its first frame was stored; the writer's own log continues at seq 2.
	// That frame is the fixture's too.
	f.wantRW = append(f.wantRW, piece{wlogs.LogStdout, []byte("a")})
	if st, _ := f.r.Attempt(f.attempt); st.Appended != 1 {
		t.Fatalf("appended %d", st.Appended)
	}

	if rs := f.r.Stats(); rs.MaxBuffered > logs.StreamBufferBound || rs.Rejected != 8 || rs.BufferedBytes != 0 {
		t.Fatalf("receiver stats %+v", rs)
	}

	// The receiver still serves a good stream. The writer's first frame
	// is seq 1: a duplicate of the stored "a", so write the same byte (the
	// kind change seals it as a frame of its own).
	if err := f.w.Write(wlogs.LogStdout, []byte("a")); err != nil {
		t.Fatal(err)
	}
	if err := f.write(wlogs.LogStderr, []byte("and the rest\n")); err != nil {
		t.Fatal(err)
	}
	f.w.Close()
	if err := f.w.Attach(ctx, agent, 1); err != nil {
		t.Fatal(err)
	}
	f.finalize(ctx)
	f.checkRecords(f.sink.(*logs.MemorySink).Records(f.attempt))
	if rs := f.r.Stats(); rs.Duplicates != 1 {
		t.Fatalf("duplicates %d, want 1", rs.Duplicates)
	}
	_ = agent.CloseWithCode(wire.CloseNormal, "")
	srv.wait()
}

// A rate limit stops the receiver reading (backpressure) instead of
// buffering: its held bytes stay within StreamBufferBound.
func TestRateLimitBoundsMemory(t *testing.T) {
	ctx := testCtx(t)
	agent, daemon := memConns(t, memory.Options{})
	const rate = 1 << 20
	f := newFixture(t, logs.Config{MemoryLimit: 8 << 20}, logs.ReceiverConfig{RateBytes: rate})
	srv := serveAll(ctx, daemon, f.r)
	rng := rand.New(rand.NewPCG(6, 6))
	for i := 0; i < 24; i++ {
		if err := f.write(wlogs.LogStdout, logText(rng, 64<<10)); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	att := make(chan error, 1)
	go func() { att <- f.w.Attach(ctx, agent, 0) }()
	f.finalize(ctx)
	elapsed := time.Since(start)
	if err := <-att; err != nil {
		t.Fatal(err)
	}
	f.checkRecords(f.sink.(*logs.MemorySink).Records(f.attempt))
	rs := f.r.Stats()
	// 1.5 MiB at 1 MiB/s with a 1 MiB burst takes at least 0.5 s, and the
	// limiter waited at least once. How much of that half second was
	// waiting depends on how fast the rest ran: on a loaded machine
	// processing took most of it and the waits only 0.1 s (Throttled is
	// logged, not bounded).
	t.Logf("1.5 MiB in %v, throttled %v in %d waits", elapsed, rs.Throttled, rs.ThrottleWaits)
	if rs.ThrottleWaits == 0 || rs.Throttled <= 0 || elapsed < 400*time.Millisecond {
		t.Fatalf("not throttled: %+v in %v", rs, elapsed)
	}
	if rs.MaxBuffered > logs.StreamBufferBound || rs.MaxBuffered == 0 {
		t.Fatalf("receiver held up to %d bytes, bound %d", rs.MaxBuffered, logs.StreamBufferBound)
	}
	_ = agent.CloseWithCode(wire.CloseNormal, "")
	srv.wait()
}

// Over the hard per-attempt cap the stream is reset with StreamRefused;
// the writer counts everything not stored as dropped and the barrier
// still completes.
func TestQuotaHardCap(t *testing.T) {
	ctx := testCtx(t)
	agent, daemon := memConns(t, memory.Options{})
	const quota = 256 << 10
	f := newFixture(t, logs.Config{ChunkSize: 16 << 10}, logs.ReceiverConfig{MaxAttemptBytes: quota})
	srv := serveAll(ctx, daemon, f.r)
	rng := rand.New(rand.NewPCG(7, 7))
	var total uint64
	for i := 0; i < 64; i++ {
		p := logText(rng, 16<<10)
		total += uint64(len(p))
		if err := f.write(wlogs.LogStdout, p); err != nil {
			t.Fatal(err)
		}
	}
	err := f.w.Attach(ctx, agent, 0)
	if !errors.Is(err, logs.ErrRefused) {
		t.Fatalf("Attach: %v, want ErrRefused", err)
	}
	wantReject(t, srv, logs.RejectQuota, semantics.StreamRefused)
	if err := f.w.Write(wlogs.LogStdout, []byte("more")); !errors.Is(err, logs.ErrRefused) {
		t.Fatalf("Write after refusal: %v", err)
	}
	total += 4
	fin := f.finalize(ctx)
	stored := uint64(f.sink.(*logs.MemorySink).Bytes(f.attempt))
	st := f.w.Stats()
	if stored == 0 || stored > quota || !st.Refused {
		t.Fatalf("stored %d of quota %d, stats %+v", stored, quota, st)
	}
	if fin.TotalBytes != total || fin.DroppedBytes != total-stored || fin.DroppedFrames == 0 {
		t.Fatalf("finalized %+v; total %d, stored %d", fin, total, stored)
	}
	if as, _ := f.r.Attempt(f.attempt); !as.Refused || as.Finalized == nil || as.Finalized.DroppedBytes != fin.DroppedBytes {
		t.Fatalf("attempt state %+v", as)
	}
	if st.PendingBytes != 0 || st.MemoryBytes != 0 {
		t.Fatalf("memory kept after refusal: %+v", st)
	}
	_ = agent.CloseWithCode(wire.CloseNormal, "")
	srv.wait()
}

// The barrier: the daemon answers LogsFinalizedV1 only once the log is
// durable up to LastSeq, and the writer's Finalize returns only on a
// matching LogsFinalizedAckV1.
func TestFinalizeBarrier(t *testing.T) {
	ctx := testCtx(t)
	agent, daemon := memConns(t, memory.Options{})
	f := newFixture(t, logs.Config{}, logs.ReceiverConfig{})
	srv := serveAll(ctx, daemon, f.r)
	for _, k := range []wlogs.LogStreamKind{wlogs.LogStdout, wlogs.LogStderr, wlogs.LogSystem} {
		if err := f.write(k, []byte(k.String()+" line\n")); err != nil {
			t.Fatal(err)
		}
	}
	m := f.w.FinalizedMessage()
	if m.LastSeq != 3 {
		t.Fatalf("LastSeq %d", m.LastSeq)
	}
	type result struct {
		ack wlogs.LogsFinalizedAckV1
		err error
	}
	daemonAck := make(chan result, 1)
	go func() {
		ack, err := f.r.Finalized(ctx, &m)
		daemonAck <- result{ack, err}
	}()
	sent := make(chan struct{})
	finDone := make(chan error, 1)
	go func() {
		finDone <- f.w.Finalize(ctx, func(*wlogs.LogsFinalizedV1) error { close(sent); return nil })
	}()
	<-sent
	// No stream has delivered anything: neither side can have finished.
	select {
	case r := <-daemonAck:
		t.Fatalf("daemon acknowledged before the frames arrived: %+v", r)
	case err := <-finDone:
		t.Fatalf("Finalize returned before the ack: %v", err)
	default:
	}
	if f.w.HandleFinalizedAck(&wlogs.LogsFinalizedAckV1{Attempt: wire.NewJobAttemptId(), LastSeq: 3}) ||
		f.w.HandleFinalizedAck(&wlogs.LogsFinalizedAckV1{Attempt: f.attempt, LastSeq: 0}) {
		t.Fatal("a foreign or short ack completed the barrier")
	}
	select {
	case err := <-finDone:
		t.Fatalf("Finalize returned on a short ack: %v", err)
	default:
	}
	att := make(chan error, 1)
	go func() { att <- f.w.Attach(ctx, agent, 0) }()
	var r result
	select {
	case r = <-daemonAck:
	case <-ctx.Done():
		t.Fatal("the daemon did not acknowledge LogsFinalizedV1")
	}
	if r.err != nil || r.ack.Attempt != f.attempt || r.ack.LastSeq != 3 {
		t.Fatalf("daemon ack %+v %v", r.ack, r.err)
	}
	if !f.w.HandleFinalizedAck(&r.ack) {
		t.Fatal("the matching ack did not complete the barrier")
	}
	if err := <-finDone; err != nil {
		t.Fatal(err)
	}
	if err := <-att; err != nil {
		t.Fatal(err)
	}
	if as, _ := f.r.Attempt(f.attempt); as.Durable != 3 {
		t.Fatalf("durable %d after the barrier", as.Durable)
	}
	f.checkRecords(f.sink.(*logs.MemorySink).Records(f.attempt))
	_ = agent.CloseWithCode(wire.CloseNormal, "")
	srv.wait()
}

// A newer Attach (agent) and a newer stream (daemon) take over the older.
func TestSupersede(t *testing.T) {
	ctx := testCtx(t)
	agent, daemon := memConns(t, memory.Options{})
	f := newFixture(t, logs.Config{}, logs.ReceiverConfig{})
	srv := serveAll(ctx, daemon, f.r)
	first := make(chan error, 1)
	go func() { first <- f.w.Attach(ctx, agent, 0) }()
	if err := f.write(wlogs.LogStdout, []byte("one\n")); err != nil {
		t.Fatal(err)
	}
	// Wait until the first stream delivered the frame (so it is open).
	for {
		if as, _ := f.r.Attempt(f.attempt); as.Appended == 1 {
			break
		}
		select {
		case <-f.acked:
		case <-ctx.Done():
			t.Fatal("first frame not delivered")
		}
	}
	second := make(chan error, 1)
	go func() { second <- f.w.Attach(ctx, agent, 0) }()
	if err := <-first; !errors.Is(err, logs.ErrSuperseded) {
		t.Fatalf("first Attach: %v, want ErrSuperseded", err)
	}
	if err := f.write(wlogs.LogStdout, []byte("two\n")); err != nil {
		t.Fatal(err)
	}
	f.finalize(ctx)
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	f.checkRecords(f.sink.(*logs.MemorySink).Records(f.attempt))

	_ = agent.CloseWithCode(wire.CloseNormal, "")
	srv.wait()
}

func TestReceiverSupersede(t *testing.T) {
	ctx := testCtx(t)
	agent, daemon := memConns(t, memory.Options{})
	f := newFixture(t, logs.Config{}, logs.ReceiverConfig{AckInterval: time.Millisecond})
	srv := serveAll(ctx, daemon, f.r)
	hdr := &wlogs.LogStreamHeaderV1{Attempt: f.attempt, Lease: f.lease, FirstSeq: 1}
	s1 := rawStream(t, agent, hdr)
	sendFrame(t, s1, &wlogs.LogFrameV1{Seq: 1, Bytes: []byte("a"), UncompressedLen: 1})
	for as, _ := f.r.Attempt(f.attempt); as.Durable < 1; as, _ = f.r.Attempt(f.attempt) { // the first Serve owns the attempt
		select {
		case <-f.acked:
		case <-ctx.Done():
			t.Fatal("no ack for the first stream")
		}
	}
	s2 := rawStream(t, agent, hdr)
	select {
	case err := <-srv.errs:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("first Serve: %v, want context.Canceled", err)
		}
	case <-ctx.Done():
		t.Fatal("first Serve still running")
	}
	sendFrame(t, s2, &wlogs.LogFrameV1{Seq: 1, Bytes: []byte("a"), UncompressedLen: 1})
	sendFrame(t, s2, &wlogs.LogFrameV1{Seq: 2, Bytes: []byte("b"), UncompressedLen: 1})
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-srv.errs; err != nil {
		t.Fatalf("second Serve: %v", err)
	}
	rs := f.r.Stats()
	if rs.Superseded != 1 || rs.Duplicates != 1 || rs.FramesAppended != 2 {
		t.Fatalf("receiver stats %+v", rs)
	}
	_ = agent.CloseWithCode(wire.CloseNormal, "")
	srv.wait()
}

// TestFramesLostOnTheDaemonSide: the agent's frames were acknowledged as
// durable by one daemon (so the writer released them) and the agent then
// streams to a receiver whose sink lacks them — a daemon restarted over a
// store that is not durable, or another daemon not sharing the store. The
// receiver asks for them (LogResumeRequestV1); the agent cannot send them.
// Neither side may wait or loop for them: with the writer closed the
// barrier is answered short at once (ShortFinals); with the writer still
// open, the agent skipping the asked-for frames gets the log refused
// (RejectLost, StreamRefused) and the barrier is answered at once.
func TestFramesLostOnTheDaemonSide(t *testing.T) {
	for _, open := range []bool{false, true} {
		t.Run(map[bool]string{false: "writer closed", true: "writer open"}[open], func(t *testing.T) {
			ctx := testCtx(t)
			agent1, daemon1 := memConns(t, memory.Options{})
			f := newFixture(t, logs.Config{}, logs.ReceiverConfig{})
			srv1 := serveAll(ctx, daemon1, f.r)
			for i := range 3 {
				if err := f.write(wlogs.LogStdout, []byte("line "+strconv.Itoa(i)+"\n")); err != nil {
					t.Fatal(err)
				}
			}
			if open {
				att := make(chan error, 1)
				go func() { att <- f.w.Attach(ctx, agent1, 0) }()
				for st := f.w.Stats(); st.LastSeq == 0 || st.Acked < st.LastSeq; st = f.w.Stats() {
					select {
					case <-f.acked:
					case <-ctx.Done():
						t.Fatalf("the first daemon never acknowledged the frames: writer %+v receiver %+v", f.w.Stats(), f.r.Stats())
					}
				}
				_ = agent1.CloseWithCode(wire.CloseNormal, "") // the first daemon goes away
				<-att
			} else {
				m := f.w.FinalizedMessage()
				go func() { _ = f.w.Attach(ctx, agent1, 0) }()
				ack, err := f.r.Finalized(ctx, &m)
				if err != nil || !f.w.HandleFinalizedAck(&ack) {
					t.Fatalf("first daemon's barrier: %+v %v", ack, err)
				}
				_ = agent1.CloseWithCode(wire.CloseNormal, "")
			}
			srv1.wait()

			// The second daemon: an empty sink.
			f.sink = &logs.MemorySink{}
			f.r = f.newReceiver(logs.ReceiverConfig{})
			agent2, daemon2 := memConns(t, memory.Options{})
			srv2 := serveAll(ctx, daemon2, f.r)
			if open {
				if err := f.write(wlogs.LogStdout, []byte("after the move\n")); err != nil {
					t.Fatal(err)
				}
			}
			m := f.w.FinalizedMessage()
			// The agent's link code: attach after the reconnect, and again
			// on every resume request.
			attaches := make(chan error, 16)
			go func() { attaches <- f.w.Attach(ctx, agent2, 0) }()
			stopResumes := make(chan struct{})
			resumed := make(chan int, 1)
			go func() {
				n := 0
				defer func() { resumed <- n }()
				for {
					select {
					case rq := <-f.resumes:
						n++
						go func() { attaches <- f.w.Attach(ctx, agent2, rq.FromSeq) }()
					case <-stopResumes:
						return
					}
				}
			}()
			ack, err := f.r.Finalized(ctx, &m)
			if err != nil {
				t.Fatalf("the barrier waited for frames that cannot come: %v", err)
			}
			close(stopResumes)
			if n := <-resumed; n != 1 {
				t.Errorf("%d resume requests, want exactly 1 (no loop)", n)
			}
			if ack.LastSeq != 0 {
				t.Errorf("ack LastSeq %d, want 0 (nothing stored here)", ack.LastSeq)
			}
			st := f.r.Stats()
			if open {
				// The writer may have closed its stream before the reset
				// reached it: it then sees the short ack (final for the
				// agent, errLogShort) rather than the refusal.
				if st.Lost != 1 || st.FramesAppended != 0 {
					t.Errorf("open writer: stats %+v, writer %+v: want the log refused as lost", st, f.w.Stats())
				}
			} else {
				if st.ShortFinals != 1 || f.w.HandleFinalizedAck(&ack) {
					t.Errorf("closed writer: stats %+v: want one short barrier, not completing the writer's", st)
				}
			}
			_ = agent2.CloseWithCode(wire.CloseNormal, "")
			srv2.wait()
		})
	}
}

// TestAuthorizeUnavailableIsRetryable (issue 27 item 4): an Authorize
// error that wraps ErrUnavailable (the authority is down) resets the
// stream with StreamInternalError, which the agent retries; any other
// Authorize error is StreamForbidden, on which it gives up the log.
func TestAuthorizeUnavailableIsRetryable(t *testing.T) {
	ctx := testCtx(t)
	agent, daemon := memConns(t, memory.Options{})
	var down atomic.Bool
	down.Store(true)
	var f *fixture
	f = newFixture(t, logs.Config{}, logs.ReceiverConfig{Authorize: func(a wire.JobAttemptId, l wire.LeaseId) error {
		if down.Load() {
			return fmt.Errorf("%w: authority: context deadline exceeded", logs.ErrUnavailable)
		}
		if a != f.attempt || l != f.lease {
			return errors.New("not this attempt's lease")
		}
		return nil
	}})
	srv := serveAll(ctx, daemon, f.r)
	hdr := &wlogs.LogStreamHeaderV1{Attempt: f.attempt, Lease: f.lease, FirstSeq: 1, Encoding: wlogs.LogEncodingRaw}
	rawStream(t, agent, hdr)
	wantReject(t, srv, logs.RejectUnavailable, semantics.StreamInternalError)
	down.Store(false)
	bad := *hdr
	bad.Lease = wire.NewLeaseId()
	rawStream(t, agent, &bad)
	wantReject(t, srv, logs.RejectUnauthorized, semantics.StreamForbidden)
}
