package capacity

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"os"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/wire"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	os.Exit(code)
}

// rowTolerance is how far the schema-derived row sizes may be from the
// sizes a real PostgreSQL stores (compacted: VACUUM FULL).
const rowTolerance = 0.25

// The database-size part of the model against a real PostgreSQL: sessions,
// leases (created, accepted, renewed twice, completed with 4 outputs)
// through the real authority, then the tables' heap and index bytes per
// row, compacted by VACUUM FULL (the model counts live rows only), beside
// the bytes as written (dead row versions of the updates included).
func TestDBRowBytesAgainstPostgres(t *testing.T) {
	const sessions, leases, renewals, outputs, resultBytes = 2000, 2000, 2, 4, 64
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dsn := pgtest.Shared(t).NewDatabase(t)
	a, err := authority.OpenPostgres(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	now := time.Now()
	type agent struct {
		runner wire.RunnerId
		ref    authority.SessionRef
	}
	ags := make([]agent, sessions)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < sessions; i += 64 {
				r, s := wire.NewRunnerId(), wire.NewAgentSessionId()
				g, err := a.RegisterSession(ctx, authority.Registration{Runner: r, Session: s, Transport: wire.NewTransportSessionId(),
					Daemon: "capacity-test-d1", Remote: "192.0.2.10:40000", Now: now})
				if err != nil {
					errs <- err
					return
				}
				ags[i] = agent{r, authority.SessionRef{Session: s, Epoch: g.Epoch}}
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(<-errs)
	}
	ref := func(size uint64) wire.CasObjectRef {
		r := wire.CasObjectRef{Algorithm: wire.DigestSHA256, Size: size}
		id := wire.NewMessageId()
		copy(r.Digest[:], id.ULID[:])
		return r
	}
	probe := ref(2 * MiB)
	if got := len(probe.AppendPostcard(nil)); got != casRefBytes {
		t.Fatalf("a CasObjectRef of 2 MiB is %d bytes in Postcard, the model says %d", got, casRefBytes)
	}
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < leases; i += 64 {
				ag := ags[i%sessions]
				l := authority.Lease{ID: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId(), Job: wire.NewJobId(), Runner: ag.runner,
					Session: ag.ref.Session, Payload: ref(64 << 10), TTL: time.Minute, ExpiresAt: now.Add(time.Minute), CreatedAt: now}
				spec := wire.NewMessageId()
				copy(l.Spec.Digest[:], spec.ULID[:])
				if err := a.CreateLease(ctx, l); err != nil {
					errs <- err
					return
				}
				if _, err := a.AcceptLease(ctx, l.ID, l.Attempt, ag.ref, now); err != nil {
					errs <- err
					return
				}
				for range renewals {
					if _, err := a.RenewLease(ctx, wire.NewMessageId(), l.ID, l.Attempt, ag.ref, now); err != nil {
						errs <- err
						return
					}
				}
				c := authority.Completion{MessageID: wire.NewMessageId(), Attempt: l.Attempt, Lease: l.ID, Session: ag.ref,
					Result: make([]byte, resultBytes), Now: now}
				for range outputs {
					c.Outputs = append(c.Outputs, ref(2*MiB))
				}
				if ack, err := a.CompleteAttempt(ctx, c); err != nil || ack != authority.AckAccepted {
					errs <- fmt.Errorf("complete: %v, %v", ack, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	size := func(table string) (perRow float64, rows int) {
		var heap, idx int64
		if err := db.QueryRowContext(ctx, `SELECT pg_relation_size($1::regclass), pg_indexes_size($1::regclass), (SELECT COUNT(*) FROM `+table+`)`, table).
			Scan(&heap, &idx, &rows); err != nil {
			t.Fatal(err)
		}
		return float64(heap+idx) / float64(rows), rows
	}
	lease, completion, dedup, session := RowBytes(outputs, resultBytes)
	for _, c := range []struct {
		table string
		model float64
		rows  int
	}{
		{"fy_leases", lease, leases},
		{"fy_completions", completion, leases},
		{"fy_dedup", dedup, leases * (renewals + 1)},
		{"fy_sessions", session, sessions},
	} {
		written, rows := size(c.table)
		if rows != c.rows {
			t.Fatalf("%s: %d rows, want %d", c.table, rows, c.rows)
		}
		if _, err := db.ExecContext(ctx, `VACUUM FULL `+c.table); err != nil {
			t.Fatal(err)
		}
		compact, _ := size(c.table)
		diff := c.model/compact - 1
		t.Logf("%s: model %.0f B per row (heap + indexes), PostgreSQL %.0f B compacted (%+.0f %%), %.0f B as written (%d rows)", c.table, c.model, compact, diff*100, written, rows)
		if math.Abs(diff) > rowTolerance {
			t.Errorf("%s: the model's %.0f B per row is %.0f %% off PostgreSQL's %.0f B (tolerance %.0f %%)", c.table, c.model, diff*100, compact, rowTolerance*100)
		}
	}
}
