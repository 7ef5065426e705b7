package logs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/wire"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// testTimeout bounds every wait in the tests.
const testTimeout = 20 * time.Second

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// memConns returns an agent and a daemon Conn over a memory pipe.
func memConns(t testing.TB, opts memory.Options) (agent, daemon *semantics.Conn) {
	t.Helper()
	c, s := memory.Pipe(opts)
	agent, err := semantics.NewConn(c, semantics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	daemon, err = semantics.NewConn(s, semantics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = agent.CloseWithCode(wire.CloseNormal, "")
		_ = daemon.CloseWithCode(wire.CloseNormal, "")
	})
	return agent, daemon
}

// server is the daemon's accept loop for log streams.
type server struct {
	wg   sync.WaitGroup
	errs chan error
}

// serveAll accepts log streams on daemon until it closes, serving each
// with r. Every Serve result goes to errs (buffered; results beyond its
// capacity are dropped, never blocking).
func serveAll(ctx context.Context, daemon *semantics.Conn, r *logs.Receiver) *server {
	s := &server{errs: make(chan error, 64)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			rs, err := daemon.AcceptUniStream(ctx)
			if err != nil {
				return
			}
			if rs.Kind() != wire.StreamLog {
				rs.CancelRead(semantics.StreamUnknownKind)
				continue
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				err := r.Serve(ctx, rs)
				select {
				case s.errs <- err:
				default:
				}
			}()
		}
	}()
	return s
}

// wait waits for the accept loop and every Serve to end (close the
// connection first).
func (s *server) wait() { s.wg.Wait() }

// fixture is an attempt with its writer and the daemon's receiver, the
// control channel modelled by direct calls.
type fixture struct {
	t       testing.TB
	attempt wire.JobAttemptId
	lease   wire.LeaseId
	w       *logs.Writer
	r       *logs.Receiver
	sink    logs.LogSink
	acked   chan struct{} // signalled after every LogAck reached the writer
	resumes chan wlogs.LogResumeRequestV1

	mu     sync.Mutex
	wantRW []piece // what the writer accepted, in order
}

type piece struct {
	kind wlogs.LogStreamKind
	data []byte
}

func newFixture(t testing.TB, wcfg logs.Config, rcfg logs.ReceiverConfig) *fixture {
	t.Helper()
	f := &fixture{t: t, attempt: wire.NewJobAttemptId(), lease: wire.NewLeaseId(),
		acked: make(chan struct{}, 1), resumes: make(chan wlogs.LogResumeRequestV1, 16)}
	wcfg.Attempt, wcfg.Lease = f.attempt, f.lease
	w, err := logs.NewWriter(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	f.w = w
	if rcfg.Sink == nil {
		rcfg.Sink = &logs.MemorySink{}
	}
	f.sink = rcfg.Sink
	f.r = f.newReceiver(rcfg)
	return f
}

func (f *fixture) newReceiver(rcfg logs.ReceiverConfig) *logs.Receiver {
	rcfg.Sink = f.sink
	if rcfg.Authorize == nil {
		rcfg.Authorize = func(a wire.JobAttemptId, l wire.LeaseId) error {
			if a != f.attempt || l != f.lease {
				return errors.New("unknown lease")
			}
			return nil
		}
	}
	rcfg.Ack = func(m wlogs.LogAckV1) {
		if m.Attempt == f.attempt {
			f.w.Ack(m.DurableSeq)
		}
		select {
		case f.acked <- struct{}{}:
		default:
		}
	}
	rcfg.Resume = func(m wlogs.LogResumeRequestV1) {
		select {
		case f.resumes <- m:
		default:
		}
	}
	r, err := logs.NewReceiver(rcfg)
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}

// write writes p and records it as expected unless it was dropped.
func (f *fixture) write(kind wlogs.LogStreamKind, p []byte) error {
	err := f.w.Write(kind, p)
	if err == nil {
		f.mu.Lock()
		f.wantRW = append(f.wantRW, piece{kind, append([]byte(nil), p...)})
		f.mu.Unlock()
	}
	return err
}

// finalize runs the barrier through the receiver and returns the
// LogsFinalizedV1 the writer sent.
func (f *fixture) finalize(ctx context.Context) wlogs.LogsFinalizedV1 {
	f.t.Helper()
	var sent wlogs.LogsFinalizedV1
	err := f.w.Finalize(ctx, func(m *wlogs.LogsFinalizedV1) error {
		sent = *m
		go func() {
			ack, err := f.r.Finalized(ctx, m)
			if err == nil {
				f.w.HandleFinalizedAck(&ack)
			}
		}()
		return nil
	})
	if err != nil {
		f.t.Fatalf("Finalize: %v", err)
	}
	return sent
}

// merge concatenates adjacent pieces of the same kind.
func merge(ps []piece) []piece {
	var out []piece
	for _, p := range ps {
		if n := len(out); n > 0 && out[n-1].kind == p.kind {
			out[n-1].data = append(out[n-1].data, p.data...)
			continue
		}
		out = append(out, piece{p.kind, append([]byte(nil), p.data...)})
	}
	return out
}

// checkRecords compares the stored records with what the writer accepted:
// same bytes, same kinds, same order, sequence numbers 1..n.
func (f *fixture) checkRecords(recs []logs.Record) {
	f.t.Helper()
	var got []piece
	for i, r := range recs {
		if r.Seq != uint64(i+1) {
			f.t.Fatalf("record %d has seq %d", i, r.Seq)
		}
		got = append(got, piece{r.Kind, r.Data})
	}
	f.mu.Lock()
	want := merge(f.wantRW)
	f.mu.Unlock()
	got = merge(got)
	if len(got) != len(want) {
		f.t.Fatalf("sink holds %d kind runs, writer was given %d", len(got), len(want))
	}
	for i := range want {
		if got[i].kind != want[i].kind || !bytes.Equal(got[i].data, want[i].data) {
			f.t.Fatalf("run %d differs: got %s %d bytes, want %s %d bytes", i, got[i].kind, len(got[i].data), want[i].kind, len(want[i].data))
		}
	}
}

func fileRecords(t testing.TB, s *logs.FileSink, a wire.JobAttemptId) []logs.Record {
	t.Helper()
	var recs []logs.Record
	err := s.ReadDurable(a, func(r logs.Record) error {
		r.Data = append([]byte(nil), r.Data...)
		recs = append(recs, r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// logText returns n bytes of line-structured, compressible log text.
func logText(rng *rand.Rand, n int) []byte {
	var b bytes.Buffer
	for b.Len() < n {
		fmt.Fprintf(&b, "[%06d] compiling forgeyard.dev/transport/pkg%03d ... ok\n", rng.IntN(1e6), rng.IntN(1000))
	}
	return b.Bytes()[:n]
}

func randomBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// waitPending waits until the writer's pending bytes are at most max,
// woken by the acks.
func (f *fixture) waitPending(ctx context.Context, max int64) error {
	for f.w.Stats().PendingBytes > max {
		select {
		case <-f.acked:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
