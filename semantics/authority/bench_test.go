package authority

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/wire"
)

// Authority throughput (issue 14 item 4), `make bench-authority`:
//
//	go test ./semantics/authority -run '^$' -bench . -count 6
//
// Every store is durable: SQLite synchronous=FULL in WAL mode on the temp
// dir's disk, PostgreSQL with fsync, synchronous_commit and full_page_writes
// on (Debian's defaults; pgtest.Options.Durable). For each store and number
// of concurrent callers:
//
//   - baseline-insert: the same database doing plain single-row
//     transactions (BEGIN; INSERT one row; COMMIT), one per operation: what
//     the disk allows without group commit;
//   - complete / renew / create: the authority's CompleteAttempt,
//     RenewLease, CreateLease through the group-commit batcher;
//   - complete-unbatched: CompleteAttempt with one transaction per
//     operation (the code before group commit), for comparison.
//
// The figure is ops/s (operations finished per second of wall time, all
// callers together).

var (
	durableOnce sync.Once
	durableSrv  *pgtest.Server
	durableErr  error
)

func durablePG(b *testing.B) *pgtest.Server {
	b.Helper()
	durableOnce.Do(func() { durableSrv, durableErr = pgtest.StartWith(pgtest.Options{Durable: true}) })
	if durableErr != nil {
		b.Fatalf("pgtest: %v", durableErr)
	}
	return durableSrv
}

// StopBenchServers stops the durable PostgreSQL server of the benchmarks.
func StopBenchServers() {
	if durableSrv != nil {
		durableSrv.Stop()
	}
}

type benchStore struct {
	name string
	open func(b *testing.B, workers int) *store
}

func benchStores() []benchStore {
	return []benchStore{
		{"sqlite-full", func(b *testing.B, workers int) *store {
			s, err := openSQLite(context.Background(), filepath.Join(b.TempDir(), "authority.db"), workers)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		}},
		{"postgres-fsync", func(b *testing.B, workers int) *store {
			s, err := openPostgres(context.Background(), durablePG(b).NewDatabase(b), workers)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		}},
	}
}

var benchT0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// agents registers n agent sessions, one per caller.
func agents(b *testing.B, s *store, n int) []SessionRef {
	b.Helper()
	refs := make([]SessionRef, n)
	parallel(b, n, n, func(i int) error {
		runner, session := wire.NewRunnerId(), wire.NewAgentSessionId()
		g, err := s.RegisterSession(context.Background(), Registration{Runner: runner, Session: session,
			Transport: wire.NewTransportSessionId(), Daemon: "bench", Now: benchT0})
		refs[i] = SessionRef{Session: session, Epoch: g.Epoch}
		return err
	})
	return refs
}

func benchLease(ref SessionRef, runner wire.RunnerId) Lease {
	return Lease{ID: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId(), Job: wire.NewJobId(), Runner: runner,
		Session: ref.Session, TTL: time.Hour, ExpiresAt: benchT0.Add(time.Hour), CreatedAt: benchT0}
}

// leases creates n accepted leases spread over the sessions.
func leases(b *testing.B, s *store, refs []SessionRef, n int) []Lease {
	b.Helper()
	runners := make([]wire.RunnerId, len(refs))
	for i, r := range refs {
		l, err := s.RunnerOf(r.Session)
		if err != nil {
			b.Fatal(err)
		}
		runners[i] = l
	}
	out := make([]Lease, n)
	parallel(b, len(refs), n, func(i int) error {
		ref := refs[i%len(refs)]
		out[i] = benchLease(ref, runners[i%len(refs)])
		if err := s.CreateLease(context.Background(), out[i]); err != nil {
			return err
		}
		_, err := s.AcceptLease(context.Background(), out[i].ID, out[i].Attempt, ref, benchT0)
		return err
	})
	return out
}

// RunnerOf returns the runner of a session (benchmark setup only).
func (s *store) RunnerOf(session wire.AgentSessionId) (wire.RunnerId, error) {
	var r wire.RunnerId
	var raw []byte
	err := s.db.QueryRow(s.rebind(`SELECT runner_id FROM fy_sessions WHERE session_id = ?`), idb(session.ULID)).Scan(&raw)
	copy(r.ULID[:], raw)
	return r, err
}

// parallel runs op(0..n-1) on `callers` goroutines and fails b on an error.
func parallel(b *testing.B, callers, n int, op func(i int) error) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	var first atomic.Value
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := op(i); err != nil {
					first.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, ok := first.Load().(error); ok {
		b.Fatal(err)
	}
}

func BenchmarkGroupCommit(b *testing.B) {
	for _, st := range benchStores() {
		for _, callers := range []int{64, 512} {
			b.Run(fmt.Sprintf("%s/baseline-insert/callers=%d", st.name, callers), func(b *testing.B) {
				s := st.open(b, 0)
				if _, err := s.db.Exec(`CREATE TABLE fy_bench (id ` + s.d.blob + ` PRIMARY KEY, v BIGINT NOT NULL)`); err != nil {
					b.Fatal(err)
				}
				q := s.rebind(`INSERT INTO fy_bench (id, v) VALUES (?, ?)`)
				b.ResetTimer()
				parallel(b, callers, b.N, func(i int) error {
					t, err := s.db.Begin()
					if err != nil {
						return err
					}
					id := wire.NewMessageId()
					if _, err := t.Exec(q, idb(id.ULID), int64(i)); err != nil {
						t.Rollback()
						return err
					}
					return t.Commit()
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
			})
			for _, batched := range []bool{true, false} {
				name := "complete"
				if !batched {
					name = "complete-unbatched"
				}
				b.Run(fmt.Sprintf("%s/%s/callers=%d", st.name, name, callers), func(b *testing.B) {
					s := st.open(b, workersOfName(st.name))
					refs := agents(b, s, callers)
					ls := leases(b, s, refs, b.N)
					if !batched {
						s.b.close()
						s.b = nil
					}
					b.ResetTimer()
					var stale atomic.Int64
					parallel(b, callers, b.N, func(i int) error {
						l := ls[i]
						ack, err := s.CompleteAttempt(context.Background(), Completion{MessageID: wire.NewMessageId(), Attempt: l.Attempt,
							Lease: l.ID, Session: refs[i%callers], Result: []byte("ok"), Now: benchT0})
						if ack != AckAccepted {
							stale.Add(1)
						}
						return err
					})
					b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
					if n := stale.Load(); n > 0 {
						b.Fatalf("%d completions not Accepted", n)
					}
				})
			}
			b.Run(fmt.Sprintf("%s/renew/callers=%d", st.name, callers), func(b *testing.B) {
				s := st.open(b, workersOfName(st.name))
				refs := agents(b, s, callers)
				ls := leases(b, s, refs, callers*4)
				b.ResetTimer()
				var notExtended atomic.Int64
				parallel(b, callers, b.N, func(i int) error {
					l := ls[i%len(ls)]
					r, err := s.RenewLease(context.Background(), wire.NewMessageId(), l.ID, l.Attempt, refs[(i%len(ls))%callers], benchT0)
					if !r.Extended {
						notExtended.Add(1)
					}
					return err
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
				if n := notExtended.Load(); n > 0 {
					b.Fatalf("%d renewals not extended", n)
				}
			})
			b.Run(fmt.Sprintf("%s/create/callers=%d", st.name, callers), func(b *testing.B) {
				s := st.open(b, workersOfName(st.name))
				refs := agents(b, s, callers)
				runners := make([]wire.RunnerId, callers)
				for i, r := range refs {
					var err error
					if runners[i], err = s.RunnerOf(r.Session); err != nil {
						b.Fatal(err)
					}
				}
				b.ResetTimer()
				parallel(b, callers, b.N, func(i int) error {
					return s.CreateLease(context.Background(), benchLease(refs[i%callers], runners[i%callers]))
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
			})
		}
	}
}

func workersOfName(name string) int {
	if name == "postgres-fsync" {
		return pgBatchWorkers
	}
	return 1
}

// BenchmarkRenewFleet: 10,000 agents, each holding one lease and renewing it
// every 10 s, their renewals spread evenly over the interval (1,000/s). One
// iteration is one full interval; run with -benchtime 1x. It reports the
// renewals per second achieved, the p99 renewal latency, and the lag: how
// long after the interval's end the last renewal finished (0 when the store
// keeps up). Falling behind shows as an achieved rate below 1,000/s and a
// lag that grows with the interval.
func BenchmarkRenewFleet(b *testing.B) {
	const agentsN, interval = 10000, 10 * time.Second
	for _, st := range benchStores() {
		b.Run(st.name, func(b *testing.B) {
			s := st.open(b, workersOfName(st.name))
			refs := agents(b, s, agentsN)
			ls := make([]Lease, agentsN)
			parallel(b, 64, agentsN, func(i int) error {
				r, err := s.RunnerOf(refs[i].Session)
				if err != nil {
					return err
				}
				ls[i] = benchLease(refs[i], r)
				if err := s.CreateLease(context.Background(), ls[i]); err != nil {
					return err
				}
				_, err = s.AcceptLease(context.Background(), ls[i].ID, ls[i].Attempt, refs[i], benchT0)
				return err
			})
			b.ResetTimer()
			var lat []time.Duration
			var lag time.Duration
			for n := 0; n < b.N; n++ {
				l, lg := renewRound(b, s, refs, ls, interval)
				lat = append(lat, l...)
				lag = max(lag, lg)
			}
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(len(lat))/b.Elapsed().Seconds(), "renewals/s")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(lag.Milliseconds()), "lag-ms")
		})
	}
}

// renewRound renews every lease once, agent i at i*interval/N after the
// start, and returns the latencies and the lag past the interval's end.
func renewRound(b *testing.B, s *store, refs []SessionRef, ls []Lease, interval time.Duration) ([]time.Duration, time.Duration) {
	n := len(ls)
	lat := make([]time.Duration, n)
	start := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	for i := 0; i < n; i++ {
		slot := start.Add(time.Duration(i) * interval / time.Duration(n))
		if d := time.Until(slot); d > 0 {
			time.Sleep(d) // pacing the load generator, not synchronisation
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			t := time.Now()
			r, err := s.RenewLease(context.Background(), wire.NewMessageId(), ls[i].ID, ls[i].Attempt, refs[i], benchT0)
			lat[i] = time.Since(t)
			if err != nil || !r.Extended {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, fmt.Errorf("renew: %+v, %v", r, err))
			}
		}(i)
	}
	wg.Wait()
	if failed.Load() > 0 {
		b.Fatalf("%d renewals failed: %v", failed.Load(), firstErr.Load())
	}
	return lat, max(0, time.Since(start)-interval)
}
