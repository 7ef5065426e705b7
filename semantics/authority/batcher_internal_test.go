package authority

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/pgtest"
)

// batchStores opens an empty store of each dialect with a scratch table.
func batchStores(t *testing.T) map[string]*store {
	t.Helper()
	out := map[string]*store{}
	sq, err := openSQLite(context.Background(), filepath.Join(t.TempDir(), "authority.db"), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sq.Close() })
	out["sqlite"] = sq
	pg, err := openPostgres(context.Background(), pgtest.Shared(t).NewDatabase(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	out["postgres"] = pg
	for _, s := range out {
		if _, err := s.db.Exec(`CREATE TABLE scratch (k BIGINT PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func insertOp(s *store, k int) func(ctx context.Context, t *sql.Tx) error {
	return func(ctx context.Context, t *sql.Tx) error {
		_, err := s.exec(ctx, t, `INSERT INTO scratch (k) VALUES (?)`, int64(k))
		return err
	}
}

// holdWorker occupies the store's single batch worker until the returned
// func is called, so operations queued meanwhile run as one batch.
func holdWorker(t *testing.T, s *store) (release func(), errc <-chan error) {
	t.Helper()
	started, gate := make(chan struct{}), make(chan struct{})
	c := make(chan error, 1)
	go func() {
		c <- s.batch(context.Background(), func(ctx context.Context, tx *sql.Tx) error {
			close(started)
			<-gate
			return nil
		})
	}()
	<-started
	return func() { close(gate) }, c
}

// queued waits until n operations are queued behind the held worker.
func queued(s *store, n int) {
	for len(s.b.queue) < n {
		runtime.Gosched()
	}
}

func scratchKeys(t *testing.T, s *store) map[int]bool {
	t.Helper()
	rows, err := s.db.Query(`SELECT k FROM scratch`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int]bool{}
	for rows.Next() {
		var k int
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		out[k] = true
	}
	return out
}

// TestBatchIsolatesFailures: in one batch, an operation refused by a check,
// one failing with a database error, and one failing after its own write do
// not affect the others; each caller gets its own result, and the failed
// operations leave nothing behind.
func TestBatchIsolatesFailures(t *testing.T) {
	for name, s := range batchStores(t) {
		t.Run(name, func(t *testing.T) {
			if _, err := s.db.Exec(`INSERT INTO scratch (k) VALUES (1000)`); err != nil {
				t.Fatal(err)
			}
			release, held := holdWorker(t, s)
			type outcome struct {
				k   int
				err error
			}
			ops := map[int]func(ctx context.Context, t *sql.Tx) error{}
			for k := 1; k <= 6; k++ {
				ops[k] = insertOp(s, k)
			}
			ops[2] = func(ctx context.Context, t *sql.Tx) error { return ErrStaleLease } // a refusal, no write
			ops[4] = insertOp(s, 1000)                                                   // duplicate key: a database error
			ops[5] = func(ctx context.Context, t *sql.Tx) error {                        // a write, then an error
				if err := insertOp(s, 5)(ctx, t); err != nil {
					return err
				}
				return fmt.Errorf("late failure")
			}
			results := make(chan outcome, len(ops))
			for k, op := range ops {
				go func() { results <- outcome{k, s.batch(context.Background(), op)} }()
			}
			queued(s, len(ops))
			release()
			if err := <-held; err != nil {
				t.Fatal(err)
			}
			for range ops {
				o := <-results
				switch o.k {
				case 2:
					if !errors.Is(o.err, ErrStaleLease) {
						t.Errorf("op 2: %v, want ErrStaleLease", o.err)
					}
				case 4:
					if o.err == nil {
						t.Errorf("op 4 (duplicate key) succeeded")
					}
				case 5:
					if o.err == nil || o.err.Error() != "late failure" {
						t.Errorf("op 5: %v, want its own error", o.err)
					}
				default:
					if o.err != nil {
						t.Errorf("op %d: %v", o.k, o.err)
					}
				}
			}
			got := scratchKeys(t, s)
			want := map[int]bool{1: true, 3: true, 6: true, 1000: true}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("rows after the batch = %v, want %v", got, want)
			}
		})
	}
}

// TestBatchRetriesConflicts: a transient conflict in one operation rolls the
// whole batch back and runs it again; every write lands exactly once.
func TestBatchRetriesConflicts(t *testing.T) {
	for name, s := range batchStores(t) {
		t.Run(name, func(t *testing.T) {
			release, held := holdWorker(t, s)
			var mu sync.Mutex
			failures := 2
			var wg sync.WaitGroup
			errs := make([]error, 8)
			for k := 0; k < 8; k++ {
				op := insertOp(s, k)
				if k == 3 {
					op = func(ctx context.Context, t *sql.Tx) error {
						if err := insertOp(s, 3)(ctx, t); err != nil {
							return err
						}
						mu.Lock()
						defer mu.Unlock()
						if failures > 0 {
							failures--
							return errors.New("ERROR: could not serialize access (SQLSTATE 40001)")
						}
						return nil
					}
				}
				wg.Add(1)
				go func() { defer wg.Done(); errs[k] = s.batch(context.Background(), op) }()
			}
			queued(s, 8)
			release()
			wg.Wait()
			if err := <-held; err != nil {
				t.Fatal(err)
			}
			for k, err := range errs {
				if err != nil {
					t.Errorf("op %d: %v", k, err)
				}
			}
			if got := scratchKeys(t, s); len(got) != 8 {
				t.Fatalf("rows = %v, want 0..7 once each", got)
			}
			if failures != 0 {
				t.Fatalf("conflict injected %d times too few", failures)
			}
		})
	}
}

// TestBatchHonoursCancel: a caller whose context ends while its operation
// is queued returns at once with the context's error, and the operation
// never runs.
func TestBatchHonoursCancel(t *testing.T) {
	s := batchStores(t)["sqlite"]
	release, held := holdWorker(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.batch(ctx, insertOp(s, 1)) }()
	queued(s, 1)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller: %v, want context.Canceled", err)
	}
	release()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	// The next operation runs; the abandoned one never did.
	if err := s.batch(context.Background(), insertOp(s, 2)); err != nil {
		t.Fatal(err)
	}
	if got := scratchKeys(t, s); len(got) != 1 || !got[2] {
		t.Fatalf("rows = %v, want only 2 (the cancelled operation must not run)", got)
	}
}

// TestBatchAfterClose: once the store is closed, a batched operation fails
// with errClosed instead of waiting for a worker that is gone.
func TestBatchAfterClose(t *testing.T) {
	s, err := openSQLite(context.Background(), filepath.Join(t.TempDir(), "authority.db"), 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		if err := s.batch(context.Background(), func(context.Context, *sql.Tx) error { return nil }); !errors.Is(err, errClosed) {
			t.Fatalf("batch after Close: %v, want errClosed", err)
		}
	}
}

// TestLazyOpsShareACommit: lazy operations (heartbeat times) queued a few
// milliseconds apart, each finding the worker idle, share one commit; a
// non-lazy operation ends a lazy batch's wait at once (with a linger of an
// hour, the test would hang if it did not).
func TestLazyOpsShareACommit(t *testing.T) {
	for name, s := range batchStores(t) {
		t.Run(name, func(t *testing.T) {
			const n = 10
			s.b.batches.Store(0)
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- s.batchLazy(context.Background(), insertOp(s, i))
				}()
				time.Sleep(2 * time.Millisecond) // spread the arrivals: the scenario, not a synchronization
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if got := len(scratchKeys(t, s)); got != n {
				t.Fatalf("%d rows written, want %d", got, n)
			}
			// 10 arrivals within ~20 ms of a 100 ms linger: one batch, two
			// if the first was taken alone before the second was queued.
			if b := s.b.batches.Load(); b > 2 {
				t.Errorf("%d lazy operations ran in %d batches, want at most 2", n, b)
			}

			old := lazyLinger
			lazyLinger = time.Hour
			lingering := make(chan struct{}, 1)
			s.b.onLinger = func() { lingering <- struct{}{} }
			defer func() { lazyLinger, s.b.onLinger = old, nil }()
			lazyDone := make(chan error, 1)
			go func() { lazyDone <- s.batchLazy(context.Background(), insertOp(s, 100)) }()
			<-lingering // the worker took the lazy op and waits for company
			if err := s.batch(context.Background(), insertOp(s, 101)); err != nil {
				t.Fatal(err)
			}
			if err := <-lazyDone; err != nil {
				t.Fatal(err)
			}
		})
	}
}
