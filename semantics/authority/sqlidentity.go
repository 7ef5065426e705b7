package authority

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"forgeyard.dev/transport/wire"
)

// identitySchema is the identity tables, part of schema migration 1
// (migrate.go; on its look-alike statements see baseSchema).
func identitySchema(d dialect) []string {
	b := d.blob
	return []string{
		`CREATE TABLE IF NOT EXISTS fy_enroll_tokens (
			token_hash ` + b + ` PRIMARY KEY,
			token_id TEXT NOT NULL UNIQUE,
			name TEXT NOT NULL,
			labels TEXT NOT NULL,
			created_ms BIGINT NOT NULL,
			expires_ms BIGINT NOT NULL,
			used_ms BIGINT NOT NULL,
			runner_id ` + b + ` NOT NULL,
			revoked BOOLEAN NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS fy_certs (
			serial TEXT PRIMARY KEY,
			runner_id ` + b + ` NOT NULL,
			not_after_ms BIGINT NOT NULL,
			issued_ms BIGINT NOT NULL,
			revoked BOOLEAN NOT NULL,
			reason TEXT NOT NULL)`,
		`CREATE INDEX IF NOT EXISTS fy_certs_runner ON fy_certs (runner_id)`,
	}
}

func checkToken(t EnrollmentToken) error {
	switch {
	case t.ID == "" || len(t.ID) > 64:
		return fmt.Errorf("authority: enrollment token id %q: 1..64 bytes", t.ID)
	case len(t.Name) > MaxTokenName || !utf8.ValidString(t.Name):
		return fmt.Errorf("authority: enrollment token name: at most %d bytes of UTF-8", MaxTokenName)
	case len(t.Labels) > MaxTokenLabels:
		return fmt.Errorf("authority: enrollment token: at most %d labels", MaxTokenLabels)
	case !t.ExpiresAt.After(t.CreatedAt):
		return errors.New("authority: enrollment token expires before it is created")
	case t.Hash == [32]byte{}:
		return errors.New("authority: enrollment token hash is zero")
	}
	for _, l := range t.Labels {
		if l == "" || len(l) > MaxTokenLabel || strings.ContainsAny(l, "\n\r") || !utf8.ValidString(l) {
			return fmt.Errorf("authority: enrollment token label %q: 1..%d bytes of UTF-8 without newlines", l, MaxTokenLabel)
		}
	}
	return nil
}

func (s *store) CreateEnrollmentToken(ctx context.Context, t EnrollmentToken) error {
	if err := checkToken(t); err != nil {
		return err
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		var n int
		if err := s.row(ctx, tx, `SELECT COUNT(*) FROM fy_enroll_tokens WHERE token_hash = ? OR token_id = ?`, t.Hash[:], t.ID).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("%w: enrollment token %s exists", ErrConflict, t.ID)
		}
		_, err := s.exec(ctx, tx, `INSERT INTO fy_enroll_tokens (token_hash, token_id, name, labels, created_ms, expires_ms, used_ms, runner_id, revoked)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`, t.Hash[:], t.ID, t.Name, strings.Join(t.Labels, "\n"),
			ms(t.CreatedAt), ms(t.ExpiresAt), int64(0), make([]byte, 16), false)
		return err
	})
}

const tokenCols = `token_hash, token_id, name, labels, created_ms, expires_ms, used_ms, runner_id, revoked`

func scanToken(r scanner) (EnrollmentToken, error) {
	var t EnrollmentToken
	var hash, runner []byte
	var labels string
	var created, expires, used int64
	if err := r.Scan(&hash, &t.ID, &t.Name, &labels, &created, &expires, &used, &runner, &t.Revoked); err != nil {
		return t, err
	}
	copy(t.Hash[:], hash)
	copy(t.Runner.ULID[:], runner)
	if labels != "" {
		t.Labels = strings.Split(labels, "\n")
	}
	t.CreatedAt, t.ExpiresAt = fromMs(created), fromMs(expires)
	if used != 0 {
		t.UsedAt = fromMs(used)
	}
	return t, nil
}

func (s *store) ConsumeEnrollmentToken(ctx context.Context, hash [32]byte, runner wire.RunnerId, now time.Time) (EnrollmentToken, error) {
	if runner == (wire.RunnerId{}) {
		return EnrollmentToken{}, errors.New("authority: ConsumeEnrollmentToken: zero runner")
	}
	var out EnrollmentToken
	err := s.tx(ctx, func(tx *sql.Tx) error {
		t, err := scanToken(s.row(ctx, tx, `SELECT `+tokenCols+` FROM fy_enroll_tokens WHERE token_hash = ? /*FOR UPDATE*/`, hash[:]))
		if errors.Is(err, sql.ErrNoRows) {
			return ErrTokenUnknown
		}
		if err != nil {
			return err
		}
		switch {
		case !t.UsedAt.IsZero():
			return fmt.Errorf("%w (by runner %s at %s)", ErrTokenUsed, t.Runner, t.UsedAt.Format(time.RFC3339))
		case t.Revoked:
			return ErrTokenRevoked
		case !t.ExpiresAt.After(now):
			return fmt.Errorf("%w (at %s)", ErrTokenExpired, t.ExpiresAt.Format(time.RFC3339))
		}
		// The conditional update is the atomic step: of two transactions
		// that both read the token unused, only one changes the row.
		res, err := s.exec(ctx, tx, `UPDATE fy_enroll_tokens SET used_ms = ?, runner_id = ? WHERE token_hash = ? AND used_ms = ? AND revoked = ?`,
			max(ms(now), 1), idb(runner.ULID), hash[:], int64(0), false)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n != 1 {
			return ErrTokenUsed
		}
		t.UsedAt, t.Runner = fromMs(max(ms(now), 1)), runner
		out = t
		return nil
	})
	return out, err
}

func (s *store) RevokeEnrollmentToken(ctx context.Context, id string, now time.Time) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		t, err := scanToken(s.row(ctx, tx, `SELECT `+tokenCols+` FROM fy_enroll_tokens WHERE token_id = ? /*FOR UPDATE*/`, id))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: enrollment token %q", ErrNotFound, id)
		}
		if err != nil {
			return err
		}
		if !t.UsedAt.IsZero() {
			return fmt.Errorf("%w (by runner %s): disable the runner instead", ErrTokenUsed, t.Runner)
		}
		_, err = s.exec(ctx, tx, `UPDATE fy_enroll_tokens SET revoked = ? WHERE token_id = ?`, true, id)
		return err
	})
}

func (s *store) EnrollmentTokens(ctx context.Context, limit int) ([]EnrollmentToken, error) {
	if limit <= 0 || limit > 10000 {
		limit = 10000
	}
	var out []EnrollmentToken
	err := s.query(ctx, `SELECT `+tokenCols+` FROM fy_enroll_tokens ORDER BY created_ms DESC, token_id LIMIT ?`, []any{limit},
		func(rows *sql.Rows) error {
			t, err := scanToken(rows)
			if err != nil {
				return err
			}
			out = append(out, t)
			return nil
		})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func checkSerial(serial string) error {
	if serial == "" || len(serial) > 64 {
		return fmt.Errorf("authority: certificate serial %q: 1..64 hex digits", serial)
	}
	for i := 0; i < len(serial); i++ {
		c := serial[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return fmt.Errorf("authority: certificate serial %q: lower-case hex digits only", serial)
		}
	}
	return nil
}

func (s *store) RecordCertificate(ctx context.Context, c IssuedCertificate) error {
	if err := checkSerial(c.Serial); err != nil {
		return err
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		var runner []byte
		err := s.row(ctx, tx, `SELECT runner_id FROM fy_certs WHERE serial = ?`, c.Serial).Scan(&runner)
		switch {
		case err == nil:
			if string(runner) != string(c.Runner.ULID[:]) {
				return fmt.Errorf("%w: serial %s recorded for another runner", ErrConflict, c.Serial)
			}
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		_, err = s.exec(ctx, tx, `INSERT INTO fy_certs (serial, runner_id, not_after_ms, issued_ms, revoked, reason) VALUES (?, ?, ?, ?, ?, ?)`,
			c.Serial, idb(c.Runner.ULID), ms(c.NotAfter), ms(c.IssuedAt), false, "")
		return err
	})
}

func (s *store) RevokeCertificate(ctx context.Context, serial, reason string, now time.Time) error {
	serial = strings.ToLower(strings.TrimPrefix(strings.ReplaceAll(serial, ":", ""), "0x"))
	if err := checkSerial(serial); err != nil {
		return err
	}
	defer s.revoking.Add(1) // after the commit (RevocationRevision)
	return s.tx(ctx, func(tx *sql.Tx) error {
		res, err := s.exec(ctx, tx, `UPDATE fy_certs SET revoked = ?, reason = ? WHERE serial = ?`, true, reason, serial)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return fmt.Errorf("%w: certificate serial %s", ErrNotFound, serial)
		}
		if s.dsn == "" { // SQLite: no events
			return nil
		}
		var runner []byte
		if err := tx.QueryRowContext(ctx, s.rebind(`SELECT runner_id FROM fy_certs WHERE serial = ?`), serial).Scan(&runner); err != nil {
			return err
		}
		ev := Event{Kind: EventRunner}
		copy(ev.Runner.ULID[:], runner)
		return s.notify(ctx, tx, ev)
	})
}

func (s *store) Certificates(ctx context.Context, runner wire.RunnerId) ([]IssuedCertificate, error) {
	var out []IssuedCertificate
	err := s.query(ctx, `SELECT serial, not_after_ms, issued_ms, revoked, reason FROM fy_certs WHERE runner_id = ? ORDER BY issued_ms DESC, serial LIMIT 1000`, []any{idb(runner.ULID)},
		func(rows *sql.Rows) error {
			c := IssuedCertificate{Runner: runner}
			var na, is int64
			if err := rows.Scan(&c.Serial, &na, &is, &c.Revoked, &c.Reason); err != nil {
				return err
			}
			c.NotAfter, c.IssuedAt = fromMs(na), fromMs(is)
			out = append(out, c)
			return nil
		})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// checkChunk bounds the placeholders of one CheckCredentials query.
const checkChunk = 500

func (s *store) CheckCredentials(ctx context.Context, creds []Credential) ([]Revocation, error) {
	if len(creds) > MaxCheckCredentials {
		return nil, fmt.Errorf("authority: CheckCredentials: %d credentials, at most %d", len(creds), MaxCheckCredentials)
	}
	disabled := map[wire.RunnerId]string{}
	revoked := map[string]string{}
	for lo := 0; lo < len(creds); lo += checkChunk {
		part := creds[lo:min(lo+checkChunk, len(creds))]
		args := []any{false}
		for _, c := range part {
			args = append(args, idb(c.Runner.ULID))
		}
		err := s.query(ctx, `SELECT runner_id, reason FROM fy_runners WHERE enabled = ? AND runner_id IN (`+placeholders(len(part))+`)`, args,
			func(r *sql.Rows) error {
				var id []byte
				var reason string
				if err := r.Scan(&id, &reason); err != nil {
					return err
				}
				var rid wire.RunnerId
				copy(rid.ULID[:], id)
				disabled[rid] = reason
				return nil
			})
		if err != nil {
			return nil, err
		}
		args = []any{true}
		for _, c := range part {
			if c.Serial != "" {
				args = append(args, c.Serial)
			}
		}
		if len(args) == 1 {
			continue
		}
		err = s.query(ctx, `SELECT serial, reason FROM fy_certs WHERE revoked = ? AND serial IN (`+placeholders(len(args)-1)+`)`, args,
			func(r *sql.Rows) error {
				var serial, reason string
				if err := r.Scan(&serial, &reason); err != nil {
					return err
				}
				revoked[serial] = reason
				return nil
			})
		if err != nil {
			return nil, err
		}
	}
	var out []Revocation
	for _, c := range creds {
		if reason, ok := disabled[c.Runner]; ok {
			out = append(out, Revocation{Credential: c, RunnerDisabled: true, Reason: reason})
		} else if reason, ok := revoked[c.Serial]; ok && c.Serial != "" {
			out = append(out, Revocation{Credential: c, Reason: reason})
		}
	}
	return out, nil
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

func (s *store) query(ctx context.Context, q string, args []any, each func(*sql.Rows) error) error {
	var rows *sql.Rows
	err := s.read(func() (err error) {
		rows, err = s.db.QueryContext(ctx, s.rebind(q), args...)
		return err
	})
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// RevocationRevision implements RevocationRevisions for SQLite: one
// connection (openSQLite), whose PRAGMA data_version changes when another
// connection — another process — commits, and never for this connection's
// own commits, which revoking counts instead (bumped after SetRunnerEnabled
// and RevokeCertificate return, so a revision read before a check that
// missed a write differs from the one read after it).
func (s *store) RevocationRevision(ctx context.Context) (Revision, bool, error) {
	if s.d.dollar { // PostgreSQL: events, not revisions
		return Revision{}, false, nil
	}
	local := s.revoking.Load()
	var v uint64
	if err := s.db.QueryRowContext(ctx, `PRAGMA data_version`).Scan(&v); err != nil {
		return Revision{}, false, err
	}
	return Revision{db: v, local: local}, true, nil
}
