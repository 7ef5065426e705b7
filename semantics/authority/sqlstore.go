package authority

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

// dialect captures the few differences between SQLite and PostgreSQL.
type dialect struct {
	name      string
	dollar    bool   // placeholders $1, $2 … instead of ?
	forUpdate string // row-lock suffix for SELECTs inside a transaction
	blob      string // binary column type
	// cteWrites: several writes can go in one statement (data-modifying
	// WITH), saving round trips to a server.
	cteWrites bool
}

var (
	sqliteDialect   = dialect{name: "sqlite", blob: "BLOB"}
	postgresDialect = dialect{name: "postgres", dollar: true, forUpdate: " FOR UPDATE", blob: "BYTEA", cteWrites: true}
)

// store is the Authority over database/sql shared by both dialects.
type store struct {
	db *sql.DB
	d  dialect
	b  *batcher // group commit of the lease operations (batcher.go)

	dsn       string        // PostgreSQL: for the LISTEN connections (watch.go)
	origin    string        // this handle's id in event payloads
	done      chan struct{} // closed by Close
	closeOnce sync.Once

	leaderMu sync.Mutex
	leader   *sql.Conn // PostgreSQL: the connection holding the sweep lock

	// revoking counts this handle's revoking writes (SetRunnerEnabled,
	// RevokeCertificate), bumped once each returns: RevocationRevision.
	revoking atomic.Uint64
}

func (s *store) rebind(query string) string {
	r := query
	if s.d.dollar {
		var b strings.Builder
		n := 0
		for i := 0; i < len(query); i++ {
			if query[i] == '?' {
				n++
				b.WriteByte('$')
				b.WriteString(strconv.Itoa(n))
				continue
			}
			b.WriteByte(query[i])
		}
		r = b.String()
	}
	if s.d.forUpdate != "" {
		r = strings.ReplaceAll(r, " /*FOR UPDATE OF l*/", s.d.forUpdate+" OF l")
	} else {
		r = strings.ReplaceAll(r, " /*FOR UPDATE OF l*/", "")
	}
	r = strings.ReplaceAll(r, " /*FOR UPDATE*/", s.d.forUpdate)
	return r
}

// newStore brings the schema up to date through ex (the pool, or one
// connection that holds a lock; see migrate) and returns the store over db.
func newStore(ctx context.Context, db *sql.DB, ex beginner, d dialect, workers int) (*store, error) {
	s := &store{db: db, d: d, origin: newOrigin(), done: make(chan struct{})}
	if err := s.migrate(ctx, ex); err != nil {
		return nil, err
	}
	if workers > 0 {
		s.b = newBatcher(s, workers)
	}
	return s, nil
}

func (s *store) Close() error {
	s.closeOnce.Do(func() { close(s.done) })
	if s.b != nil {
		s.b.close()
	}
	s.leaderMu.Lock()
	if s.leader != nil {
		_, _ = s.leader.ExecContext(context.Background(), `SELECT pg_advisory_unlock($1)`, sweepLockKey)
		_ = s.leader.Close()
		s.leader = nil
	}
	s.leaderMu.Unlock()
	return s.db.Close()
}

// Ping implements Pinger: one round trip to the database (PostgreSQL: an
// empty query on a pooled connection; SQLite: the file is open).
func (s *store) Ping(ctx context.Context) error {
	select {
	case <-s.done:
		return errors.New("authority: store closed")
	default:
	}
	return s.db.PingContext(ctx)
}

var _ Pinger = (*store)(nil)

func ms(t time.Time) int64 { return t.UnixMilli() }

func fromMs(v int64) time.Time { return time.UnixMilli(v).UTC() }

func idb(u [16]byte) []byte { return u[:] }

// tx runs fn in a transaction, retrying serialization failures a few times,
// and a transaction whose connection the server ended before it committed
// (connLost: a pooled connection that outlived a database restart).
func (s *store) tx(ctx context.Context, fn func(*sql.Tx) error) error {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		var t *sql.Tx
		t, err = s.db.BeginTx(ctx, nil)
		if err != nil {
			if err = beforeCommit(err); retryable(err) {
				continue
			}
			return err
		}
		err = fn(t)
		if err == nil {
			err = t.Commit()
			if err == nil {
				return nil
			}
		} else {
			_ = t.Rollback()
			err = beforeCommit(err)
		}
		if !retryable(err) {
			return err
		}
	}
	return err
}

// retryable reports transient failures: PostgreSQL serialization/deadlock
// failures, SQLite busy errors (matched on the SQLSTATE / code carried in
// the driver error text, the one portable signal across both drivers), and
// a connection lost before its transaction committed (errLostConn).
func retryable(err error) bool {
	if err == nil {
		return false
	}
	var lost *errLostConn
	if errors.As(err, &lost) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "SQLSTATE 40001") || strings.Contains(msg, "SQLSTATE 40P01") ||
		strings.Contains(msg, "SQLITE_BUSY") || strings.Contains(msg, "database is locked")
}

// errLostConn marks a failure of a transaction's connection before its
// Commit: the server rolled the transaction back, so running it again on
// another connection cannot apply it twice. A Commit's own error is never
// marked — whether that transaction committed is unknown.
type errLostConn struct{ err error }

func (e *errLostConn) Error() string { return e.err.Error() }
func (e *errLostConn) Unwrap() error { return e.err }

// beforeCommit marks err as errLostConn when it says the server ended the
// connection: SQLSTATE class 08 (connection exception) or 57P01–57P03
// (administrator shutdown, crash shutdown, cannot connect now), an error
// pgconn knows was raised before anything was sent, or database/sql's
// ErrBadConn.
func beforeCommit(err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	lost := errors.Is(err, driver.ErrBadConn) || pgconn.SafeToRetry(err) ||
		(errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P0")))
	if !lost {
		return err
	}
	return &errLostConn{err}
}

// read runs a read outside a transaction (fn), again on a fresh
// connection when the server had ended the pooled one (errLostConn): a
// read is always safe to repeat.
func (s *store) read(fn func() error) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if err = fn(); err == nil {
			return nil
		}
		var lost *errLostConn
		if !errors.As(beforeCommit(err), &lost) {
			return err
		}
	}
	return err
}

func (s *store) exec(ctx context.Context, t *sql.Tx, q string, args ...any) (sql.Result, error) {
	traceWrite(ctx)
	return t.ExecContext(ctx, s.rebind(q), args...)
}

func (s *store) row(ctx context.Context, t *sql.Tx, q string, args ...any) *sql.Row {
	return t.QueryRowContext(ctx, s.rebind(q), args...)
}

// ---- runners ----

func (s *store) RunnerStatus(ctx context.Context, runner wire.RunnerId) (RunnerStatus, error) {
	st := RunnerStatus{Runner: runner, Enabled: true}
	err := s.tx(ctx, func(t *sql.Tx) error {
		var changed int64
		err := s.row(ctx, t, `SELECT enabled, reason, changed_ms FROM fy_runners WHERE runner_id = ?`, idb(runner.ULID)).
			Scan(&st.Enabled, &st.Reason, &changed)
		if err == nil {
			st.Changed = fromMs(changed)
		} else if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		return s.row(ctx, t, `SELECT COUNT(*) FROM fy_sessions WHERE runner_id = ? AND ended = ?`, idb(runner.ULID), false).Scan(&st.Sessions)
	})
	return st, err
}

// setRunnerFlag, in t, upserts a runner's flag row (table with the flag in
// column, its reason and changed_ms: fy_runners.enabled,
// fy_runner_drain.drained) and notifies the runner event onEv or offEv.
// table and column are constants of this package, never input.
func (s *store) setRunnerFlag(ctx context.Context, t *sql.Tx, table, column string, runner wire.RunnerId, on bool, reason string, now time.Time, onEv, offEv uint32) error {
	if _, err := s.exec(ctx, t, `INSERT INTO `+table+` (runner_id, `+column+`, reason, changed_ms) VALUES (?, ?, ?, ?)
			ON CONFLICT (runner_id) DO UPDATE SET `+column+` = excluded.`+column+`, reason = excluded.reason, changed_ms = excluded.changed_ms`,
		idb(runner.ULID), on, reason, ms(now)); err != nil {
		return err
	}
	ev := Event{Kind: EventRunner, Runner: runner, Reason: offEv}
	if on {
		ev.Reason = onEv
	}
	return s.notify(ctx, t, ev)
}

func (s *store) SetRunnerEnabled(ctx context.Context, runner wire.RunnerId, enabled bool, reason string, now time.Time) error {
	defer s.revoking.Add(1) // after the commit (RevocationRevision)
	return s.tx(ctx, func(t *sql.Tx) error {
		if err := s.setRunnerFlag(ctx, t, "fy_runners", "enabled", runner, enabled, reason, now, RunnerEventEnabled, RunnerEventDisabled); err != nil {
			return err
		}
		if enabled {
			return nil
		}
		if _, err := s.exec(ctx, t, `UPDATE fy_leases SET state = ?, revoke_reason = ? WHERE runner_id = ? AND state IN (?, ?)`,
			string(LeaseRevoked), "runner disabled: "+reason, idb(runner.ULID), string(LeaseOffered), string(LeaseAccepted)); err != nil {
			return err
		}
		_, err := s.exec(ctx, t, `UPDATE fy_sessions SET ended = ? WHERE runner_id = ? AND ended = ?`, true, idb(runner.ULID), false)
		return err
	})
}

// ---- sessions ----

type sessionRow struct {
	runner    wire.RunnerId
	epoch     uint64
	transport wire.TransportSessionId
	daemon    string
	remote    string
	since     int64
	ended     bool
}

func (s *store) loadSession(ctx context.Context, t *sql.Tx, session wire.AgentSessionId, lock bool) (sessionRow, error) {
	var r sessionRow
	var runner, transport []byte
	var epoch int64
	q := `SELECT runner_id, epoch, transport_id, daemon, remote, since_ms, ended FROM fy_sessions WHERE session_id = ?`
	if lock {
		q += ` /*FOR UPDATE*/`
	}
	err := s.row(ctx, t, q, idb(session.ULID)).Scan(&runner, &epoch, &transport, &r.daemon, &r.remote, &r.since, &r.ended)
	if errors.Is(err, sql.ErrNoRows) {
		return r, ErrNotFound
	}
	if err != nil {
		return r, err
	}
	copy(r.runner.ULID[:], runner)
	copy(r.transport.ULID[:], transport)
	r.epoch = uint64(epoch)
	return r, nil
}

func (r sessionRow) holder(session wire.AgentSessionId) SessionHolder {
	return SessionHolder{Session: session, Runner: r.runner, Epoch: r.epoch, Transport: r.transport,
		Daemon: r.daemon, Remote: r.remote, Since: fromMs(r.since)}
}

func (s *store) runnerEnabled(ctx context.Context, t *sql.Tx, runner wire.RunnerId) (bool, error) {
	var enabled bool
	err := s.row(ctx, t, `SELECT enabled FROM fy_runners WHERE runner_id = ?`, idb(runner.ULID)).Scan(&enabled)
	if errors.Is(err, sql.ErrNoRows) {
		return true, nil
	}
	return enabled, err
}

func (s *store) RegisterSession(ctx context.Context, r Registration) (SessionGrant, error) {
	var g SessionGrant
	err := s.batch(ctx, func(ctx context.Context, t *sql.Tx) error {
		g = SessionGrant{}
		enabled, err := s.runnerEnabled(ctx, t, r.Runner)
		if err != nil {
			return err
		}
		if !enabled {
			return ErrRunnerDisabled
		}
		cur, err := s.loadSession(ctx, t, r.Session, true)
		switch {
		case errors.Is(err, ErrNotFound):
			// A new agent session supersedes the runner's older sessions:
			// their leases are not inherited (§15).
			if _, err := s.exec(ctx, t, `UPDATE fy_leases SET state = ?, revoke_reason = ? WHERE runner_id = ? AND session_id <> ? AND state IN (?, ?)`,
				string(LeaseRevoked), "agent session superseded", idb(r.Runner.ULID), idb(r.Session.ULID), string(LeaseOffered), string(LeaseAccepted)); err != nil {
				return err
			}
			if _, err := s.exec(ctx, t, `UPDATE fy_sessions SET ended = ? WHERE runner_id = ? AND ended = ?`, true, idb(r.Runner.ULID), false); err != nil {
				return err
			}
			if _, err := s.exec(ctx, t, `INSERT INTO fy_sessions (session_id, runner_id, epoch, transport_id, daemon, remote, since_ms, ended)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, idb(r.Session.ULID), idb(r.Runner.ULID), int64(1), idb(r.Transport.ULID), r.Daemon, r.Remote, ms(r.Now), false); err != nil {
				return err
			}
			g.Epoch = 1
			return nil
		case err != nil:
			return err
		}
		if cur.runner != r.Runner {
			return ErrSessionOwnership
		}
		if cur.ended {
			return ErrStaleSession
		}
		prev := cur.holder(r.Session)
		g.Previous = &prev
		g.Epoch = cur.epoch + 1
		_, err = s.exec(ctx, t, `UPDATE fy_sessions SET epoch = ?, transport_id = ?, daemon = ?, remote = ?, since_ms = ? WHERE session_id = ?`,
			int64(g.Epoch), idb(r.Transport.ULID), r.Daemon, r.Remote, ms(r.Now), idb(r.Session.ULID))
		return err
	})
	if err != nil {
		return SessionGrant{}, err
	}
	return g, nil
}

// checkRef verifies a SessionRef inside a transaction.
func (s *store) checkRef(ctx context.Context, t *sql.Tx, ref SessionRef) (sessionRow, error) {
	cur, err := s.loadSession(ctx, t, ref.Session, false)
	if errors.Is(err, ErrNotFound) {
		return cur, ErrStaleSession
	}
	if err != nil {
		return cur, err
	}
	if cur.ended {
		return cur, ErrStaleSession
	}
	if ref.Epoch != 0 && ref.Epoch != cur.epoch {
		return cur, ErrFenced
	}
	return cur, nil
}

func (s *store) CheckEpoch(ctx context.Context, session wire.AgentSessionId, epoch uint64) (SessionHolder, error) {
	var h SessionHolder
	err := s.tx(ctx, func(t *sql.Tx) error {
		cur, err := s.checkRef(ctx, t, SessionRef{Session: session, Epoch: epoch})
		h = cur.holder(session)
		return err
	})
	return h, err
}

func (s *store) EndSession(ctx context.Context, session wire.AgentSessionId, now time.Time) error {
	return s.tx(ctx, func(t *sql.Tx) error {
		res, err := s.exec(ctx, t, `UPDATE fy_sessions SET ended = ? WHERE session_id = ?`, true, idb(session.ULID))
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return ErrNotFound
		}
		_, err = s.exec(ctx, t, `UPDATE fy_leases SET state = ?, revoke_reason = ? WHERE session_id = ? AND state IN (?, ?)`,
			string(LeaseRevoked), "agent session ended", idb(session.ULID), string(LeaseOffered), string(LeaseAccepted))
		return err
	})
}

// ---- leases ----

const leaseCols = `lease_id, attempt_id, job_id, runner_id, session_id, spec_id, payload, ttl_ms, expires_ms, state, cancelled, cancel_reason, revoke_reason, created_ms`

type scanner interface{ Scan(...any) error }

func scanLease(sc scanner) (Lease, error) {
	var l Lease
	var id, attempt, job, runner, session, spec, payload []byte
	var ttl, expires, created, reason int64
	var state string
	if err := sc.Scan(&id, &attempt, &job, &runner, &session, &spec, &payload, &ttl, &expires, &state,
		&l.Cancelled, &reason, &l.RevokeReason, &created); err != nil {
		return l, err
	}
	copy(l.ID.ULID[:], id)
	copy(l.Attempt.ULID[:], attempt)
	copy(l.Job.ULID[:], job)
	copy(l.Runner.ULID[:], runner)
	copy(l.Session.ULID[:], session)
	copy(l.Spec.Digest[:], spec)
	d := postcard.NewDecoder(payload)
	l.Payload.DecodePostcard(&d)
	if err := d.Finish(); err != nil {
		return l, fmt.Errorf("authority: corrupt payload ref of lease %s: %w", l.ID, err)
	}
	l.TTL = time.Duration(ttl) * time.Millisecond
	l.ExpiresAt = fromMs(expires)
	l.State = LeaseState(state)
	l.CancelReason = uint32(reason)
	l.CreatedAt = fromMs(created)
	return l, nil
}

func (s *store) loadLease(ctx context.Context, t *sql.Tx, id wire.LeaseId, lock bool) (Lease, error) {
	q := `SELECT ` + leaseCols + ` FROM fy_leases WHERE lease_id = ?`
	if lock {
		q += ` /*FOR UPDATE*/`
	}
	l, err := scanLease(s.row(ctx, t, q, idb(id.ULID)))
	if errors.Is(err, sql.ErrNoRows) {
		return l, ErrNotFound
	}
	return l, err
}

func (s *store) CreateLease(ctx context.Context, l Lease) error {
	if l.TTL <= 0 {
		return fmt.Errorf("authority: lease %s has no TTL", l.ID)
	}
	if l.State == "" {
		l.State = LeaseOffered
	}
	payload := l.Payload.AppendPostcard(nil)
	return s.batch(ctx, func(ctx context.Context, t *sql.Tx) error {
		cur, err := s.loadLease(ctx, t, l.ID, true)
		if err == nil {
			if cur.Attempt != l.Attempt || cur.Session != l.Session || cur.Runner != l.Runner || cur.Spec != l.Spec || cur.Job != l.Job {
				return ErrConflict
			}
			return nil // duplicate offer: safe no-op (§67)
		}
		if !errors.Is(err, ErrNotFound) {
			return err
		}
		_, err = s.exec(ctx, t, `INSERT INTO fy_leases (`+leaseCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			idb(l.ID.ULID), idb(l.Attempt.ULID), idb(l.Job.ULID), idb(l.Runner.ULID), idb(l.Session.ULID), l.Spec.Digest[:],
			payload, l.TTL.Milliseconds(), ms(l.ExpiresAt), string(l.State), l.Cancelled, int64(l.CancelReason), l.RevokeReason, ms(l.CreatedAt))
		return err
	})
}

func (s *store) Lease(ctx context.Context, id wire.LeaseId) (Lease, error) {
	var l Lease
	err := s.tx(ctx, func(t *sql.Tx) error {
		var err error
		l, err = s.loadLease(ctx, t, id, false)
		return err
	})
	return l, err
}

var leaseColsL = "l." + strings.ReplaceAll(leaseCols, ", ", ", l.")

// refLease is checkRef(ref) followed by loadLease(id, lock) in one query
// (one round trip): the lease row locked, the session read as checkRef reads
// it (without a lock, at the statement's start, as checkRef did before the
// lease lock was taken). Errors are checkRef's first, then ErrNotFound for a
// missing lease.
func (s *store) refLease(ctx context.Context, t *sql.Tx, ref SessionRef, id wire.LeaseId) (Lease, error) {
	var epoch sql.NullInt64
	var ended sql.NullBool
	l, err := scanLease(extraScanner{s.row(ctx, t, `SELECT `+leaseColsL+`, s.epoch, s.ended FROM fy_leases l
		LEFT JOIN fy_sessions s ON s.session_id = ? WHERE l.lease_id = ? /*FOR UPDATE OF l*/`,
		idb(ref.Session.ULID), idb(id.ULID)), []any{&epoch, &ended}})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		// No such lease: the session's verdict comes first, as before.
		if _, err := s.checkRef(ctx, t, ref); err != nil {
			return Lease{}, err
		}
		return Lease{}, ErrNotFound
	case err != nil:
		return Lease{}, err
	case !epoch.Valid || ended.Bool:
		return Lease{}, ErrStaleSession
	case ref.Epoch != 0 && ref.Epoch != uint64(epoch.Int64):
		return Lease{}, ErrFenced
	}
	return l, nil
}

// extraScanner scans the columns after scanLease's into extra.
type extraScanner struct {
	sc    scanner
	extra []any
}

func (e extraScanner) Scan(dest ...any) error { return e.sc.Scan(append(dest, e.extra...)...) }

// boundLease loads a lease for an agent operation and checks that it belongs
// to the caller's session and attempt.
func (s *store) boundLease(ctx context.Context, t *sql.Tx, id wire.LeaseId, attempt wire.JobAttemptId, ref SessionRef) (Lease, error) {
	l, err := s.refLease(ctx, t, ref, id)
	if errors.Is(err, ErrNotFound) {
		return l, ErrStaleLease
	}
	if err != nil {
		return l, err
	}
	if l.Attempt != attempt || l.Session != ref.Session {
		return l, ErrStaleLease
	}
	return l, nil
}

func (s *store) AcceptLease(ctx context.Context, id wire.LeaseId, attempt wire.JobAttemptId, ref SessionRef, now time.Time) (Lease, error) {
	var l Lease
	err := s.batch(ctx, func(ctx context.Context, t *sql.Tx) error {
		var err error
		l, err = s.boundLease(ctx, t, id, attempt, ref)
		if err != nil {
			return err
		}
		switch l.State {
		case LeaseAccepted:
			return nil
		case LeaseOffered:
			l.State = LeaseAccepted
			_, err = s.exec(ctx, t, `UPDATE fy_leases SET state = ? WHERE lease_id = ?`, string(LeaseAccepted), idb(id.ULID))
			return err
		default:
			return ErrStaleLease
		}
	})
	return l, err
}

func (s *store) RejectLease(ctx context.Context, id wire.LeaseId, attempt wire.JobAttemptId, ref SessionRef, now time.Time) error {
	return s.batch(ctx, func(ctx context.Context, t *sql.Tx) error {
		l, err := s.boundLease(ctx, t, id, attempt, ref)
		if err != nil {
			return err
		}
		switch l.State {
		case LeaseRejected:
			return nil
		case LeaseOffered:
			_, err = s.exec(ctx, t, `UPDATE fy_leases SET state = ? WHERE lease_id = ?`, string(LeaseRejected), idb(id.ULID))
			return err
		default:
			return ErrStaleLease
		}
	})
}

// dedup answers are small fixed encodings; see encodeRenew.
func (s *store) dedupGet(ctx context.Context, t *sql.Tx, msg wire.MessageId, op string) ([]byte, bool, error) {
	var gotOp string
	var answer []byte
	err := s.row(ctx, t, `SELECT op, answer FROM fy_dedup WHERE message_id = ?`, idb(msg.ULID)).Scan(&gotOp, &answer)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if gotOp != op {
		return nil, false, ErrConflict
	}
	return answer, true, nil
}

func (s *store) dedupPut(ctx context.Context, t *sql.Tx, msg wire.MessageId, op string, answer []byte, now time.Time) error {
	_, err := s.exec(ctx, t, `INSERT INTO fy_dedup (message_id, op, answer, created_ms) VALUES (?, ?, ?, ?) ON CONFLICT (message_id) DO NOTHING`,
		idb(msg.ULID), op, answer, ms(now))
	return err
}

func encodeRenew(r RenewResult) []byte {
	b := make([]byte, 0, 14)
	var flags byte
	if r.Extended {
		flags |= 1
	}
	if r.Revoked {
		flags |= 2
	}
	if r.Unknown {
		flags |= 4
	}
	b = append(b, flags)
	b = binary.BigEndian.AppendUint64(b, uint64(r.ExpiresAt.UnixMilli()))
	return binary.BigEndian.AppendUint32(b, r.CancelReason)
}

func decodeRenew(b []byte) (RenewResult, error) {
	if len(b) != 13 {
		return RenewResult{}, fmt.Errorf("authority: corrupt renewal dedup record (%d bytes)", len(b))
	}
	r := RenewResult{Extended: b[0]&1 != 0, Revoked: b[0]&2 != 0, Unknown: b[0]&4 != 0}
	if r.Extended {
		r.ExpiresAt = fromMs(int64(binary.BigEndian.Uint64(b[1:9])))
	}
	r.CancelReason = binary.BigEndian.Uint32(b[9:13])
	return r, nil
}

// renewedExpiry is the expiry a renewal gives the live lease l at now (a
// LeaseRenewV1, or a resync's Continue): TTL from now, never earlier than
// the expiry it has.
func renewedExpiry(l Lease, now time.Time) time.Time {
	exp := now.Add(l.TTL)
	if exp.Before(l.ExpiresAt) {
		exp = l.ExpiresAt
	}
	return exp
}

func (s *store) RenewLease(ctx context.Context, msg wire.MessageId, id wire.LeaseId, attempt wire.JobAttemptId, ref SessionRef, now time.Time) (RenewResult, error) {
	var res RenewResult
	err := s.batch(ctx, func(ctx context.Context, t *sql.Tx) error {
		res = RenewResult{}
		if ans, ok, err := s.dedupGet(ctx, t, msg, "renew"); err != nil {
			return err
		} else if ok {
			res, err = decodeRenew(ans)
			return err
		}
		l, err := s.boundLease(ctx, t, id, attempt, ref)
		switch {
		case errors.Is(err, ErrStaleLease):
			res.Unknown = true
		case err != nil:
			return err
		case !l.State.Live():
			res.Revoked, res.CancelReason = true, l.CancelReason
		case l.Cancelled:
			// A cancelled lease still lives until the agent completes, but
			// the renewal tells the agent to stop (§72–73).
			res.Revoked, res.CancelReason = true, l.CancelReason
		default:
			exp := renewedExpiry(l, now)
			res.Extended, res.ExpiresAt = true, fromMs(ms(exp))
			if s.d.cteWrites {
				// The extension and its dedup record in one statement.
				_, err := s.exec(ctx, t, `WITH l AS (UPDATE fy_leases SET expires_ms = ? WHERE lease_id = ?)
					INSERT INTO fy_dedup (message_id, op, answer, created_ms) VALUES (?, ?, ?, ?) ON CONFLICT (message_id) DO NOTHING`,
					ms(exp), idb(id.ULID), idb(msg.ULID), "renew", encodeRenew(res), ms(now))
				return err
			}
			if _, err := s.exec(ctx, t, `UPDATE fy_leases SET expires_ms = ? WHERE lease_id = ?`, ms(exp), idb(id.ULID)); err != nil {
				return err
			}
		}
		return s.dedupPut(ctx, t, msg, "renew", encodeRenew(res), now)
	})
	return res, err
}

func (s *store) CancelAttempt(ctx context.Context, attempt wire.JobAttemptId, reason uint32, now time.Time) (Lease, error) {
	var l Lease
	err := s.tx(ctx, func(t *sql.Tx) error {
		var err error
		l, err = scanLease(s.row(ctx, t, `SELECT `+leaseCols+` FROM fy_leases WHERE attempt_id = ? AND state IN (?, ?) /*FOR UPDATE*/`,
			idb(attempt.ULID), string(LeaseOffered), string(LeaseAccepted)))
		if errors.Is(err, sql.ErrNoRows) {
			// A repeated cancel that arrives after the cancelled attempt
			// already ended is as safe as one before (§73).
			l, err = scanLease(s.row(ctx, t, `SELECT `+leaseCols+` FROM fy_leases WHERE attempt_id = ? AND cancelled = ?`,
				idb(attempt.ULID), true))
			if errors.Is(err, sql.ErrNoRows) {
				return ErrNotFound
			}
			return err
		}
		if err != nil {
			return err
		}
		if l.Cancelled {
			return nil // repeated cancel is safe (§73)
		}
		l.Cancelled, l.CancelReason = true, reason
		if _, err = s.exec(ctx, t, `UPDATE fy_leases SET cancelled = ?, cancel_reason = ? WHERE lease_id = ?`, true, int64(reason), idb(l.ID.ULID)); err != nil {
			return err
		}
		return s.notify(ctx, t, Event{Kind: EventCancel, Lease: l.ID, Attempt: l.Attempt, Session: l.Session, Reason: reason})
	})
	return l, err
}

func (s *store) CompleteAttempt(ctx context.Context, c Completion) (AckKind, error) {
	var ack AckKind
	err := s.batch(ctx, func(ctx context.Context, t *sql.Tx) error {
		// The session check, and the lease row locked first so concurrent
		// retries of one completion serialize here and the second sees the
		// first one's record.
		l, err := s.refLease(ctx, t, c.Session, c.Lease)
		if errors.Is(err, ErrStaleSession) || errors.Is(err, ErrNotFound) {
			ack = AckStaleRejected
			return nil
		}
		if err != nil {
			return err // ErrFenced and storage errors
		}
		var outputs []byte
		outputs = postcard.AppendLen(outputs, len(c.Outputs))
		for i := range c.Outputs {
			outputs = c.Outputs[i].AppendPostcard(outputs)
		}
		result := c.Result
		if result == nil {
			result = []byte{}
		}
		if s.d.cteWrites && l.Attempt == c.Attempt && l.Session == c.Session.Session && l.State.Live() {
			// PostgreSQL, the common case in one round trip: record the
			// completion unless the attempt has one, and only then complete
			// the lease and write the dedup record. If the attempt already
			// has a completion nothing is written and the checks below
			// answer from it, as for any other database.
			var inserted int
			traceWrite(ctx)
			if err := s.row(ctx, t, `WITH c AS (INSERT INTO fy_completions (attempt_id, message_id, lease_id, session_id, result, outputs, recorded_ms)
					VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (attempt_id) DO NOTHING RETURNING 1),
				l AS (UPDATE fy_leases SET state = ? WHERE lease_id = ? AND EXISTS (SELECT 1 FROM c)),
				d AS (INSERT INTO fy_dedup (message_id, op, answer, created_ms) SELECT ?::bytea, ?::text, ?::bytea, ?::bigint
					WHERE EXISTS (SELECT 1 FROM c) ON CONFLICT (message_id) DO NOTHING)
				SELECT COUNT(*) FROM c`,
				idb(c.Attempt.ULID), idb(c.MessageID.ULID), idb(c.Lease.ULID), idb(c.Session.Session.ULID), result, outputs, ms(c.Now),
				string(LeaseCompleted), idb(c.Lease.ULID),
				idb(c.MessageID.ULID), "complete", []byte{byte(AckAccepted)}, ms(c.Now)).Scan(&inserted); err != nil {
				return err
			}
			if inserted == 1 {
				ack = AckAccepted
				return nil
			}
		}
		// An attempt completes once: a retry of the same message is a
		// duplicate, anything else is stale (§76–77).
		var prevMsg []byte
		err = s.row(ctx, t, `SELECT message_id FROM fy_completions WHERE attempt_id = ?`, idb(c.Attempt.ULID)).Scan(&prevMsg)
		switch {
		case err == nil:
			if string(prevMsg) == string(c.MessageID.ULID[:]) {
				ack = AckDuplicateAccepted
			} else {
				ack = AckStaleRejected
			}
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		if l.Attempt != c.Attempt || l.Session != c.Session.Session || !l.State.Live() {
			ack = AckStaleRejected
			return nil
		}
		if _, err := s.exec(ctx, t, `INSERT INTO fy_completions (attempt_id, message_id, lease_id, session_id, result, outputs, recorded_ms)
			VALUES (?, ?, ?, ?, ?, ?, ?)`, idb(c.Attempt.ULID), idb(c.MessageID.ULID), idb(c.Lease.ULID), idb(c.Session.Session.ULID),
			result, outputs, ms(c.Now)); err != nil {
			return err
		}
		if _, err := s.exec(ctx, t, `UPDATE fy_leases SET state = ? WHERE lease_id = ?`, string(LeaseCompleted), idb(c.Lease.ULID)); err != nil {
			return err
		}
		ack = AckAccepted
		return s.dedupPut(ctx, t, c.MessageID, "complete", []byte{byte(AckAccepted)}, c.Now)
	})
	return ack, err
}

func (s *store) Resync(ctx context.Context, ref SessionRef, claims []AttemptClaim, now time.Time) ([]Decision, error) {
	var out []Decision
	err := s.batch(ctx, func(ctx context.Context, t *sql.Tx) error {
		out = out[:0]
		if _, err := s.checkRef(ctx, t, ref); err != nil {
			return err
		}
		for _, c := range claims {
			d := Decision{Attempt: c.Attempt, Lease: c.Lease, Kind: DecisionStale}
			l, err := s.loadLease(ctx, t, c.Lease, true)
			switch {
			case errors.Is(err, ErrNotFound):
			case err != nil:
				return err
			case l.Attempt != c.Attempt || l.Session != ref.Session || !l.State.Live():
			case l.Cancelled:
				d.Kind, d.CancelReason = DecisionCancel, l.CancelReason
			default:
				exp := renewedExpiry(l, now)
				if _, err := s.exec(ctx, t, `UPDATE fy_leases SET expires_ms = ? WHERE lease_id = ?`, ms(exp), idb(l.ID.ULID)); err != nil {
					return err
				}
				d.Kind, d.ExpiresAt = DecisionContinue, fromMs(ms(exp))
			}
			out = append(out, d)
		}
		return nil
	})
	return out, err
}

func (s *store) SessionLeases(ctx context.Context, session wire.AgentSessionId, states ...LeaseState) ([]Lease, error) {
	q := `SELECT ` + leaseCols + ` FROM fy_leases WHERE session_id = ?`
	args := []any{idb(session.ULID)}
	if len(states) > 0 {
		seen := map[LeaseState]bool{}
		var in []string
		for _, st := range states {
			if !st.Valid() {
				return nil, fmt.Errorf("authority: unknown lease state %q", st)
			}
			if !seen[st] { // at most five distinct states: the query stays bounded
				seen[st] = true
				in = append(in, "?")
				args = append(args, string(st))
			}
		}
		q += ` AND state IN (` + strings.Join(in, ", ") + `)`
	}
	q += ` ORDER BY created_ms, lease_id LIMIT ?`
	args = append(args, MaxSessionLeases)
	return s.queryLeases(ctx, q, args, 0)
}

// queryLeases runs q (lease columns) in one transaction and returns its
// rows. It queues on the group commit with the writes (batcher.go): on
// SQLite's one connection a read transaction of its own waits for the
// write lock like any write (_txlock=immediate), so a registration herd's
// resync reads would each take a turn of their own. With max > 0, a result of more than max rows is ErrTooManyLiveLeases
// (q must then ask for max+1).
func (s *store) queryLeases(ctx context.Context, q string, args []any, max int) ([]Lease, error) {
	var out []Lease
	err := s.batch(ctx, func(ctx context.Context, t *sql.Tx) error {
		out = out[:0]
		rows, err := t.QueryContext(ctx, s.rebind(q), args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if max > 0 && len(out) == max {
				return ErrTooManyLiveLeases
			}
			l, err := scanLease(rows)
			if err != nil {
				return err
			}
			out = append(out, l)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (s *store) ExpiredLeases(ctx context.Context, before time.Time, limit int) ([]Lease, error) {
	if limit <= 0 || limit > 10000 {
		limit = 10000
	}
	return s.queryLeases(ctx, `SELECT `+leaseCols+` FROM fy_leases WHERE state IN (?, ?) AND expires_ms < ? ORDER BY expires_ms LIMIT ?`,
		[]any{string(LeaseOffered), string(LeaseAccepted), ms(before), limit}, 0)
}

func (s *store) RevokeLease(ctx context.Context, id wire.LeaseId, reason string, now time.Time) error {
	return s.tx(ctx, func(t *sql.Tx) error {
		l, err := s.loadLease(ctx, t, id, true)
		if err != nil {
			return err
		}
		if !l.State.Live() {
			return nil
		}
		if _, err = s.exec(ctx, t, `UPDATE fy_leases SET state = ?, revoke_reason = ? WHERE lease_id = ?`, string(LeaseRevoked), reason, idb(id.ULID)); err != nil {
			return err
		}
		return s.notify(ctx, t, Event{Kind: EventRevoke, Lease: l.ID, Attempt: l.Attempt, Session: l.Session})
	})
}

func (s *store) ExpireLease(ctx context.Context, id wire.LeaseId, before time.Time) (bool, error) {
	var expired bool
	err := s.tx(ctx, func(t *sql.Tx) error {
		expired = false
		// The row lock (PostgreSQL FOR UPDATE; SQLite's BEGIN IMMEDIATE write
		// lock) orders this against RenewLease and Resync: the expiry read
		// here is the last committed one, so a renewal that committed after
		// the sweep's ExpiredLeases is seen and the lease is kept.
		l, err := s.loadLease(ctx, t, id, true)
		if err != nil {
			return err
		}
		if !l.State.Live() || !l.ExpiresAt.Before(before) {
			return nil
		}
		if _, err := s.exec(ctx, t, `UPDATE fy_leases SET state = ?, revoke_reason = ? WHERE lease_id = ?`,
			string(LeaseRevoked), ReasonLeaseExpired, idb(id.ULID)); err != nil {
			return err
		}
		expired = true
		return s.notify(ctx, t, Event{Kind: EventRevoke, Lease: l.ID, Attempt: l.Attempt, Session: l.Session})
	})
	return expired, err
}

func (s *store) Completions(ctx context.Context, attempt wire.JobAttemptId) (int, error) {
	var n int
	err := s.tx(ctx, func(t *sql.Tx) error {
		return s.row(ctx, t, `SELECT COUNT(*) FROM fy_completions WHERE attempt_id = ?`, idb(attempt.ULID)).Scan(&n)
	})
	return n, err
}

func (s *store) PruneDedup(ctx context.Context, before time.Time) (int, error) {
	var n int64
	err := s.tx(ctx, func(t *sql.Tx) error {
		res, err := s.exec(ctx, t, `DELETE FROM fy_dedup WHERE created_ms < ?`, ms(before))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return int(n), err
}

// sweepLockKey is the PostgreSQL advisory lock of the sweep leader (advisory
// locks are per database, so each authority database has its own leader).
const sweepLockKey = 74657266

// SweepLeader implements SweepElector.
func (s *store) SweepLeader(ctx context.Context) (bool, error) {
	if !s.d.dollar {
		return true, nil // SQLite: one daemon per database file
	}
	s.leaderMu.Lock()
	defer s.leaderMu.Unlock()
	if s.leader != nil {
		// Still holding it while the connection lives.
		var held bool
		err := s.leader.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'
			AND pid = pg_backend_pid() AND objid = $1 AND granted)`, sweepLockKey).Scan(&held)
		if err == nil && held {
			return true, nil
		}
		// Lost (the server ended the session) or unknown: drop the physical
		// connection, never hand it back to the pool, where it could keep
		// the lock with nobody sweeping; then try to lead on a new one.
		discard(s.leader)
		s.leader = nil
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return false, err
	}
	var got bool
	if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, sweepLockKey).Scan(&got); err != nil {
		discard(conn) // the lock may have been taken
		return false, err
	}
	if !got {
		_ = conn.Close()
		return false, nil
	}
	s.leader = conn
	return true, nil
}

// discard closes c's physical connection instead of returning it to the pool.
func discard(c *sql.Conn) {
	_ = c.Raw(func(any) error { return driver.ErrBadConn })
	_ = c.Close()
}

var (
	_ Authority    = (*store)(nil)
	_ SweepElector = (*store)(nil)
)
