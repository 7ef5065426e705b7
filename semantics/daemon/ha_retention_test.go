package daemon_test

import (
	"context"
	"fmt"
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

// TestHARetentionKeepsOtherDaemonsLiveAttempts (issue 15 item 5): daemons
// A and B share one PostgreSQL authority and one S3 bucket (a real
// versitygw). An attempt runs on daemon B with a payload from the bucket
// and writes its log there; daemon A, which holds no session at all, runs
// retention with max_age 1 ns: the payload and the log of B's live attempt
// survive (the live set is every live lease in the authority,
// authority.LiveLister), an unreferenced object is deleted. Once the
// attempt completed, A's next pass deletes its log and payload too: only
// the live lease had kept them.
func TestHARetentionKeepsOtherDaemonsLiveAttempts(t *testing.T) {
	b := enginetest.MemoryBackend()
	pki := trusttest.NewPKI(t)
	dsn := pgtest.Shared(t).NewDatabase(t)
	s3cfg := s3test.Shared(t).NewBucket(t)
	type shared struct {
		sink  *logs.BucketSink
		store *cas.BucketStore
	}
	open := func() (authority.Authority, shared) {
		a, err := authority.OpenPostgres(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		bk, err := s3store.Open(context.Background(), s3cfg) // its own client: another daemon
		if err != nil {
			t.Fatal(err)
		}
		var s shared
		if s.sink, err = logs.NewBucketSink(logs.BucketSinkConfig{Bucket: bk, Prefix: "logs/"}); err != nil {
			t.Fatal(err)
		}
		if s.store, err = cas.NewBucketStore(cas.BucketStoreConfig{Bucket: bk, Prefix: "cas/"}); err != nil {
			t.Fatal(err)
		}
		return a, s
	}
	authA, sa := open()
	authB, sb := open()
	// Daemon A collects on demand below; its maintenance schedule first
	// runs an hour after the start, out of the way.
	wa := enginetest.NewWorldWith(t, b, pki, authA, sharedDB, func(c *daemon.Config) {
		c.ID = "daemon-a"
		c.LogSink, c.ContentStore = sa.sink, sa.store
		c.Retention = daemon.Retention{MaxAge: time.Nanosecond, Interval: time.Hour}
	})
	wb := enginetest.NewWorldWith(t, b, pki, authB, sharedDB, func(c *daemon.Config) {
		c.ID = "daemon-b"
		c.LogSink, c.ContentStore = sb.sink, sb.store
	})

	payload := enginetest.PutObject(t, sb.store, []byte("the payload of the attempt live on daemon B"))
	unreferenced := enginetest.PutObject(t, sb.store, []byte("an object no live attempt references"))
	hold := make(chan struct{})
	exec := agent.ExecutorFunc(func(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
		_ = out.Log(wlogs.LogStdout, []byte(fmt.Sprintf("log of %s\n", job.Attempt)))
		select {
		case <-hold:
		case <-ctx.Done():
			return agent.Result{Kind: agentwire.ResultCancelled}
		}
		return agent.Result{Kind: agentwire.ResultSucceeded}
	})
	id := wb.NewIdentity()
	wb.StartAgent(id, exec, enginetest.SpoolIn(t.TempDir()))
	wb.AwaitActive(id.Runner)
	ctx := context.Background()
	o := enginetest.Offer(61)
	o.Payload = payload
	live, err := wb.D.OfferLease(ctx, id.Runner, o)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for sb.sink.Durable(live.Attempt) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the live attempt's log never became durable on daemon B")
		}
		time.Sleep(2 * time.Millisecond) // acks are periodic; no event to await here
	}
	if n := len(wa.D.Sessions()); n != 0 {
		t.Fatalf("daemon A holds %d sessions, want none: the live attempt is daemon B's alone", n)
	}

	res, err := wa.D.CollectGarbage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := sb.store.Stat(payload); err != nil || !st.Complete {
		t.Fatalf("daemon A's retention deleted the payload of daemon B's live attempt (%+v, %v)", st, err)
	}
	if n := durableIn(t, s3cfg, live.Attempt); n == 0 {
		t.Fatal("daemon A's retention deleted the log of daemon B's live attempt")
	}
	if st, err := sb.store.Stat(unreferenced); err != nil || st.Complete {
		t.Fatalf("the unreferenced object survived daemon A's retention (%+v, %v)", st, err)
	}
	if res.DeletedObjs != 1 || res.DeletedLogs != 0 {
		t.Fatalf("daemon A's first pass: %+v; want 1 object and no log deleted", res)
	}

	close(hold)
	wb.AwaitCompletion(live.Attempt, agentwire.AckAccepted)
	res, err = wa.D.CollectGarbage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := sb.store.Stat(payload); err != nil || st.Complete {
		t.Fatalf("the payload survived once its attempt ended (%+v, %v)", st, err)
	}
	if n := durableIn(t, s3cfg, live.Attempt); n != 0 {
		t.Fatalf("the log survived once its attempt ended (durable %d)", n)
	}
	if res.DeletedObjs != 1 || res.DeletedLogs != 1 {
		t.Fatalf("daemon A's second pass: %+v; want the payload and the log deleted", res)
	}
}

// durableIn is the attempt's durable log sequence in the bucket, read by
// a fresh sink (a sink caches what it opened); 0 when none is stored.
func durableIn(t *testing.T, cfg s3store.Config, a wire.JobAttemptId) uint64 {
	t.Helper()
	bk, err := s3store.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := logs.NewBucketSink(logs.BucketSinkConfig{Bucket: bk, Prefix: "logs/"})
	if err != nil {
		t.Fatal(err)
	}
	return s.Durable(a)
}
