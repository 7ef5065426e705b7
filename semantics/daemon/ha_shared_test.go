package daemon_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/internal/testkit/s3test"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/semantics/objstore/s3store"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// watchedStore records where each transfer of the store starts (the
// verified prefix it resumes from) and can hold an upload once it has
// received `holdAt` bytes, to cut the daemon mid-upload.
type watchedStore struct {
	*cas.BucketStore
	mu      sync.Mutex
	starts  []uint64
	holdAt  uint64
	reached chan struct{} // closed when holdAt bytes arrived
	release chan struct{} // the held Append returns when closed
	once    sync.Once
}

func (s *watchedStore) Create(ref wire.CasObjectRef) (cas.PartialObject, error) {
	p, err := s.BucketStore.Create(ref)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.starts = append(s.starts, p.Len())
	s.mu.Unlock()
	return &watchedPartial{PartialObject: p, s: s}, nil
}

func (s *watchedStore) firstStart() (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.starts) == 0 {
		return 0, false
	}
	return s.starts[0], true
}

type watchedPartial struct {
	cas.PartialObject
	s *watchedStore
}

func (p *watchedPartial) Append(b []byte) error {
	if err := p.PartialObject.Append(b); err != nil {
		return err
	}
	if s := p.s; s.holdAt > 0 && p.Len() >= s.holdAt {
		s.once.Do(func() { close(s.reached) })
		<-s.release // the daemon is cut meanwhile; this transfer is the old holder's
	}
	return nil
}

// TestSharedDataPlaneAgentMoves (issue 15 item 1): three daemons share one
// PostgreSQL authority and one S3 bucket (a real versitygw). The agent runs
// an attempt on daemon 1, which is cut when half the log is durable: the
// agent continues on daemon 2, whose first log stream of the attempt starts
// at daemon 1's durable sequence + 1. Daemon 2 is cut when half of the
// 12 MiB output has arrived: the agent continues on daemon 3, whose upload
// starts from the verified prefix daemon 2 stored (not 0). In the end the
// attempt completed exactly once, every log line is stored once and in
// order, and the output is stored and verifies — all read from the bucket
// by a fresh store, as any daemon would.
func TestSharedDataPlaneAgentMoves(t *testing.T) {
	b := enginetest.QuicBackend()
	dsn := pgtest.Shared(t).NewDatabase(t)
	s3cfg := s3test.Shared(t).NewBucket(t)
	bucket := func() *s3store.Store {
		st, err := s3store.Open(context.Background(), s3cfg)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	stores := func(holdAt uint64) (*logs.BucketSink, *watchedStore) {
		bk := bucket() // its own client: another daemon
		sink, err := logs.NewBucketSink(logs.BucketSinkConfig{Bucket: bk, Prefix: "logs/"})
		if err != nil {
			t.Fatal(err)
		}
		st, err := cas.NewBucketStore(cas.BucketStoreConfig{Bucket: bk, Prefix: "cas/", ChunkSize: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		return sink, &watchedStore{BucketStore: st, holdAt: holdAt, reached: make(chan struct{}), release: make(chan struct{})}
	}
	const outSize = 12 << 20
	pki := trusttest.NewPKI(t)
	type dmn struct {
		w      *enginetest.World
		sink   *logs.BucketSink
		store  *watchedStore
		firsts chan uint64 // FirstSeq of each log stream
	}
	newDaemon := func(name string, holdAt uint64) *dmn {
		a, err := authority.OpenPostgres(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		x := &dmn{firsts: make(chan uint64, 16)}
		x.sink, x.store = stores(holdAt)
		x.w = enginetest.NewWorldWith(t, b, pki, a, sharedDB, func(c *daemon.Config) {
			c.ID = name
			c.LogSink, c.ContentStore = x.sink, x.store
			c.Hooks.OnLogStream = func(h wlogs.LogStreamHeaderV1) { x.firsts <- h.FirstSeq }
		})
		return x
	}
	d1, d2, d3 := newDaemon("daemon-1", 0), newDaemon("daemon-2", outSize/2), newDaemon("daemon-3", 0)
	t.Cleanup(func() { close(d2.store.release) })

	const lines = 300
	line := func(i int) string {
		return fmt.Sprintf("line %04d of the moving agent %s\n", i, strings.Repeat("y", 60))
	}
	half, cont := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	exec := agent.ExecutorFunc(func(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
		runs.Add(1)
		for i := 0; i < lines; i++ {
			if i == lines/2 {
				close(half)
				select {
				case <-cont:
				case <-ctx.Done():
					return agent.Result{Kind: agentwire.ResultCancelled}
				}
			}
			if err := out.Log(wlogs.LogStdout, []byte(line(i))); err != nil {
				return agent.Result{Kind: agentwire.ResultInfraError, Message: err.Error()}
			}
		}
		if _, err := out.PutOutput(agent.SyntheticOutput(job.Spec, outSize)); err != nil {
			return agent.Result{Kind: agentwire.ResultInfraError, Message: err.Error()}
		}
		return agent.Result{Kind: agentwire.ResultSucceeded}
	})
	id := d1.w.NewIdentity()
	a, _, _ := d1.w.StartAgent(id, exec, enginetest.SpoolIn(t.TempDir()), func(c *agent.Config) {
		for _, d := range []*dmn{d2, d3} {
			c.Endpoints = append(c.Endpoints, agent.Endpoint{Address: d.w.Addr, Dialer: c.Endpoints[0].Dialer, Backend: b.Name})
		}
	})
	d1.w.AwaitActive(id.Runner)
	l, err := d1.w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(31))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	<-half
	t.Logf("%v: half the log written", time.Since(t0))
	deadline := time.Now().Add(15 * time.Second)
	for d1.sink.Durable(l.Attempt) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no log frame durable on daemon 1")
		}
		time.Sleep(2 * time.Millisecond) // acks are periodic; no event to await here
	}
	durable1 := d1.sink.Durable(l.Attempt)
	cut := func(d *dmn) {
		// A cut, not a drain: the connections close at once.
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		_ = d.w.D.Shutdown(ctx)
	}
	cut(d1)
	d2.w.AwaitRegistered(id.Runner)
	close(cont) // the second half of the log flows to daemon 2

	select {
	case <-d2.store.reached:
	case <-time.After(60 * time.Second):
		t.Fatal("the upload never reached half of the output on daemon 2")
	}
	t.Logf("%v: half the output on daemon 2", time.Since(t0))
	go cut(d2) // the held transfer returns once daemon 3 has the agent (t.Cleanup)
	d3.w.AwaitRegistered(id.Runner)
	t.Logf("%v: agent registered on daemon 3", time.Since(t0))
	ev := d3.w.AwaitCompletion(l.Attempt, agentwire.AckAccepted)
	if ev.Result.Kind != agentwire.ResultSucceeded {
		t.Fatalf("result %v", ev.Result)
	}

	t.Logf("%v: completed on daemon 3", time.Since(t0))
	// The log resumed on daemon 2 from daemon 1's durable sequence.
	select {
	case first := <-d2.firsts:
		// The agent resends from what it knew acknowledged (daemon 1's
		// last LogAck may have been lost in the cut): never later than
		// daemon 1's durable seq + 1, and daemon 2, reading the durable
		// sequence from the bucket, skips the frames daemon 1 stored
		// instead of storing them twice.
		if first < 1 || first > durable1+1 {
			t.Fatalf("daemon 2's first log stream starts at seq %d; daemon 1 had %d durable", first, durable1)
		}
		dup := d2.w.D.LogReceiver().Stats().Duplicates
		if first <= durable1 && dup < int64(durable1-first+1) {
			t.Fatalf("daemon 2's stream starts at seq %d, daemon 1 had %d durable, but daemon 2 skipped only %d duplicates",
				first, durable1, dup)
		}
		t.Logf("log: daemon 1 durable %d, daemon 2's stream starts at seq %d, %d duplicates skipped", durable1, first, dup)
	default:
		t.Fatal("no log stream reached daemon 2")
	}
	// The upload resumed on daemon 3 from daemon 2's verified prefix.
	start, ok := d3.store.firstStart()
	if !ok || start == 0 || start > outSize/2 {
		t.Fatalf("daemon 3's upload started at %d (ok %v); want the prefix daemon 2 stored, in (0, %d]", start, ok, outSize/2)
	}
	t.Logf("upload: daemon 3 resumed at byte %d of %d", start, outSize)

	if n, _ := d3.w.Auth.Completions(context.Background(), l.Attempt); n != 1 {
		t.Fatalf("completions %d", n)
	}
	if runs.Load() != 1 {
		t.Fatalf("executor ran %d times", runs.Load())
	}
	// Read everything back through fresh stores on the bucket.
	sink, st := stores(0)
	var got strings.Builder
	var last uint64
	if err := sink.ReadDurable(l.Attempt, func(r logs.Record) error {
		if r.Seq != last+1 {
			return fmt.Errorf("seq %d after %d", r.Seq, last)
		}
		last = r.Seq
		if r.Kind == wlogs.LogStdout {
			got.Write(r.Data)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for i := 0; i < lines; i++ {
		want.WriteString(line(i))
	}
	if got.String() != want.String() {
		t.Fatalf("the bucket holds %d log bytes, want %d", got.Len(), want.Len())
	}
	outs, ok := d3.w.D.FinalizedOutputs(l.Attempt)
	if !ok || len(outs) != 1 {
		t.Fatalf("declared outputs %v (%v)", outs, ok)
	}
	r, err := st.Open(outs[0], 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil || uint64(n) != outs[0].Size || !bytes.Equal(h.Sum(nil), outs[0].Digest[:]) {
		t.Fatalf("stored output: %d bytes, %v, digest ok %v", n, err, bytes.Equal(h.Sum(nil), outs[0].Digest[:]))
	}
	if s := enginetest.AwaitConnected(t, a); s.Endpoint != d3.w.Addr {
		t.Fatalf("agent on %s", s.Endpoint)
	}
}
