package wanbench

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/wire"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// logUpload streams size bytes of log text (64 KiB writes, uncompressed)
// from the agent side with logs.Writer to a logs.Receiver on the daemon
// side (a discarding MemorySink acknowledging durability) and waits for
// the finalize barrier: every byte was received and acknowledged. It
// returns MB/s of log text.
func (e *env) logUpload(tb testing.TB, o *oursImpl, p path, size int) float64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ab, db, _, _ := o.backendPair(tb, e, p)
	ac, err := semantics.NewConn(ab, semConfig())
	if err != nil {
		tb.Fatal(err)
	}
	dc, err := semantics.NewConn(db, semConfig())
	if err != nil {
		tb.Fatal(err)
	}
	attempt, lease := wire.NewJobAttemptId(), wire.NewLeaseId()
	w, err := logs.NewWriter(logs.Config{Attempt: attempt, Lease: lease, MemoryLimit: 64 << 20})
	if err != nil {
		tb.Fatal(err)
	}
	acked := make(chan struct{}, 1)
	r, err := logs.NewReceiver(logs.ReceiverConfig{Sink: &logs.MemorySink{Discard: true}, MaxAttemptBytes: -1,
		AckBytes: 512 << 10, AckInterval: 5 * time.Millisecond,
		Authorize: func(a wire.JobAttemptId, l wire.LeaseId) error {
			if a != attempt || l != lease {
				return fmt.Errorf("unknown lease")
			}
			return nil
		},
		Ack: func(m wlogs.LogAckV1) {
			w.Ack(m.DurableSeq)
			select {
			case acked <- struct{}{}:
			default:
			}
		}})
	if err != nil {
		tb.Fatal(err)
	}
	var srv sync.WaitGroup
	srv.Add(1)
	go func() { // the daemon's accept loop: log streams only
		defer srv.Done()
		for {
			rs, err := dc.AcceptUniStream(ctx)
			if err != nil {
				return
			}
			srv.Add(1)
			go func() { defer srv.Done(); _ = r.Serve(ctx, rs) }()
		}
	}()
	defer func() {
		_ = ac.CloseWithCode(wire.CloseNormal, "")
		_ = dc.CloseWithCode(wire.CloseNormal, "")
		srv.Wait()
	}()
	var line bytes.Buffer
	for i := 0; line.Len() < 64<<10; i++ {
		fmt.Fprintf(&line, "[%06d] compiling forgeyard.dev/transport/pkg%03d ... ok\n", i, i%1000)
	}
	chunk := line.Bytes()[:64<<10]
	att := make(chan error, 1)
	t0 := time.Now()
	go func() { att <- w.Attach(ctx, ac, 0) }()
	for sent := 0; sent < size; sent += len(chunk) {
		for w.Stats().PendingBytes > 16<<20 { // the benchmark producer's backpressure
			select {
			case <-acked:
			case <-ctx.Done():
				tb.Fatal(ctx.Err())
			}
		}
		if err := w.Write(wlogs.LogStdout, chunk); err != nil {
			tb.Fatal(err)
		}
	}
	fin := w.FinalizedMessage()
	go func() {
		ack, err := r.Finalized(ctx, &fin)
		if err == nil {
			w.HandleFinalizedAck(&ack)
		}
	}()
	if err := w.Finalize(ctx, func(*wlogs.LogsFinalizedV1) error { return nil }); err != nil {
		tb.Fatalf("log finalize: %v", err)
	}
	el := time.Since(t0)
	if err := <-att; err != nil {
		tb.Fatalf("log writer: %v", err)
	}
	st := w.Stats()
	if st.DroppedBytes != 0 || st.RawBytesSent < uint64(size) {
		tb.Fatalf("log writer stats %+v after %d bytes", st, size)
	}
	return float64(st.RawBytesSent) / el.Seconds() / 1e6
}
