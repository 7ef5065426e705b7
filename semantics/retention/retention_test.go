package retention_test

import (
	"context"
	"os"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/s3test"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/cas/castest"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/semantics/objstore/s3store"
	"forgeyard.dev/transport/semantics/retention"
	"forgeyard.dev/transport/wire"
	wlogs "forgeyard.dev/transport/wire/logs"
)

func TestMain(m *testing.M) {
	code := m.Run()
	s3test.StopShared()
	os.Exit(code)
}

type sink interface {
	logs.LogSink
	logs.Syncer
	logs.Collector
	ReadDurable(a wire.JobAttemptId, fn func(logs.Record) error) error
}

type store interface {
	cas.ContentStore
	cas.Collector
}

// stores runs f on the filesystem stores and on the bucket stores over S3.
func stores(t *testing.T, f func(t *testing.T, s sink, c store)) {
	t.Run("filesystem", func(t *testing.T) {
		s, err := logs.NewFileSink(t.TempDir(), logs.FileSinkOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		c, err := cas.NewFSStore(cas.FSStoreConfig{Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		f(t, s, c)
	})
	t.Run("s3", func(t *testing.T) {
		b, err := s3store.Open(context.Background(), s3test.Shared(t).NewBucket(t))
		if err != nil {
			t.Fatal(err)
		}
		s, err := logs.NewBucketSink(logs.BucketSinkConfig{Bucket: b, Prefix: "logs/"})
		if err != nil {
			t.Fatal(err)
		}
		c, err := cas.NewBucketStore(cas.BucketStoreConfig{Bucket: b, Prefix: "cas/", ChunkSize: 8192})
		if err != nil {
			t.Fatal(err)
		}
		f(t, s, c)
	})
}

func writeLog(t *testing.T, s sink, a wire.JobAttemptId, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		if err := s.Append(a, uint64(i), wlogs.LogStdout, 0, make([]byte, 1000)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Sync(a); err != nil {
		t.Fatal(err)
	}
}

func hasLog(s sink, a wire.JobAttemptId) bool {
	n := 0
	_ = s.ReadDurable(a, func(logs.Record) error { n++; return nil })
	return n > 0
}

func hasObj(c store, ref wire.CasObjectRef) bool {
	st, err := c.Stat(ref)
	return err == nil && st.Complete
}

// TestCollectByAge: everything older than max_age goes, except the log of
// a live attempt and the objects live attempts reference.
func TestCollectByAge(t *testing.T) {
	stores(t, func(t *testing.T, s sink, c store) {
		liveA, deadA := wire.NewJobAttemptId(), wire.NewJobAttemptId()
		writeLog(t, s, liveA, 5)
		writeLog(t, s, deadA, 7)
		liveO, deadO := castest.Put(t, c, castest.Data(20_000, 1)), castest.Put(t, c, castest.Data(30_000, 2))
		live := func(context.Context) (retention.Live, error) {
			return retention.Live{Attempts: map[wire.JobAttemptId]bool{liveA: true}, Objects: map[wire.CasObjectRef]bool{liveO: true}}, nil
		}
		// An hour from now, everything is older than 30 minutes.
		res, err := retention.Collect(context.Background(), s, c, retention.Policy{MaxAge: 30 * time.Minute}, live, time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if !hasLog(s, liveA) || hasLog(s, deadA) || !hasObj(c, liveO) || hasObj(c, deadO) {
			t.Fatalf("after collection: live log %v, dead log %v, live object %v, dead object %v",
				hasLog(s, liveA), hasLog(s, deadA), hasObj(c, liveO), hasObj(c, deadO))
		}
		if res.DeletedLogs != 1 || res.DeletedObjs != 1 || res.DeletedCASBytes != 30_000 || res.DeletedLogBytes < 7000 ||
			res.CASBytes != 20_000 || res.LogBytes < 5000 {
			t.Fatalf("result %+v", res)
		}
		// Nothing is younger than max_age now: a second run deletes nothing.
		res, err = retention.Collect(context.Background(), s, c, retention.Policy{MaxAge: 30 * time.Minute}, live, time.Now())
		if err != nil || res.DeletedLogs+res.DeletedObjs != 0 {
			t.Fatalf("second run %+v, %v", res, err)
		}
	})
}

// TestCollectBySize: the oldest go first until logs and objects fit in
// max_bytes; live ones stay even when that leaves the store over the
// limit.
func TestCollectBySize(t *testing.T) {
	stores(t, func(t *testing.T, s sink, c store) {
		var refs []wire.CasObjectRef
		for i := 0; i < 4; i++ {
			refs = append(refs, castest.Put(t, c, castest.Data(25_000, byte(10+i))))
		}
		a := wire.NewJobAttemptId()
		writeLog(t, s, a, 10) // ~10 KB
		live := func(context.Context) (retention.Live, error) {
			return retention.Live{Objects: map[wire.CasObjectRef]bool{refs[0]: true}}, nil
		}
		res, err := retention.Collect(context.Background(), s, c, retention.Policy{MaxBytes: 60_000}, live, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if res.LogBytes+res.CASBytes > 60_000 || !hasObj(c, refs[0]) || res.DeletedObjs+res.DeletedLogs == 0 {
			t.Fatalf("result %+v; live object kept %v", res, hasObj(c, refs[0]))
		}
		n := 0
		for _, r := range refs {
			if hasObj(c, r) {
				n++
			}
		}
		if int64(n)*25_000 != res.CASBytes {
			t.Fatalf("%d objects left, result says %d bytes", n, res.CASBytes)
		}
		// Only the live object: over the limit, still kept.
		res, err = retention.Collect(context.Background(), s, c, retention.Policy{MaxBytes: 1}, live, time.Now())
		if err != nil || !hasObj(c, refs[0]) || res.CASBytes != 25_000 || res.LogBytes != 0 {
			t.Fatalf("result %+v, %v", res, err)
		}
	})
}

// TestCollectPrunesPartials: an abandoned partial upload goes; a complete
// object stays.
func TestCollectPrunesPartials(t *testing.T) {
	stores(t, func(t *testing.T, s sink, c store) {
		data := castest.Data(20_000, 3)
		ref := castest.Ref(data)
		p, err := c.Create(ref)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Append(data[:9000]); err != nil {
			t.Fatal(err)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		kept := castest.Put(t, c, castest.Data(100, 4))
		if st, _ := c.Stat(ref); st.Partial != 9000 {
			t.Fatalf("partial %+v", st)
		}
		res, err := retention.Collect(context.Background(), s, c, retention.Policy{PartialMaxAge: time.Nanosecond}, nil, time.Now())
		if err != nil || res.PrunedPartials != 1 {
			t.Fatalf("result %+v, %v", res, err)
		}
		if st, _ := c.Stat(ref); st.Partial != 0 || !hasObj(c, kept) {
			t.Fatalf("after pruning: partial %+v, complete object kept %v", st, hasObj(c, kept))
		}
	})
}
