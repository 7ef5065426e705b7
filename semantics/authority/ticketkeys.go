package authority

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"
)

// TLS session ticket keys (issue 25 item 4). A daemon encrypts the TLS
// session tickets it issues to agents with a key of the current rotation
// period, and accepts tickets under the keys of the few periods before it.
// The keys live in the authority so that every daemon of an HA set issues
// and accepts the same tickets and a restarted daemon keeps accepting the
// tickets it issued before: an agent reconnecting after a restart, a
// failover or a network change resumes its TLS session instead of paying
// a full certificate handshake.

// TicketKeysKept is how many periods before the current one keep their
// key (decrypt only): a ticket stays usable for at least that many
// periods after it was issued (and never longer than crypto/tls's own
// seven-day limit).
const TicketKeysKept = 2

// MinTicketKeyPeriod is the shortest rotation period TicketKeys accepts.
const MinTicketKeyPeriod = time.Second

// TicketKeyStore is implemented by an authority that keeps TLS session
// ticket keys (both SQL stores). Obtain it with TicketKeysOf.
type TicketKeyStore interface {
	// TicketKeys returns the session ticket keys for now and a rotation
	// of period: the current period's key first (the one to encrypt
	// with), then the next period's (created ahead, so a daemon whose
	// clock runs a little early already decrypts what the others will
	// encrypt with), then the kept previous periods', newest first. It
	// creates the keys of the current and the next period if they do not
	// exist yet (random; daemons sharing the database converge on the one
	// written first) and deletes keys older than TicketKeysKept periods.
	// Every daemon sharing the authority must use the same period.
	TicketKeys(ctx context.Context, now time.Time, period time.Duration) ([][32]byte, error)
}

// TicketKeysOf returns a's ticket key store, or nil when it has none (a
// test double); it looks through decorators (Unwrapper).
func TicketKeysOf(a Authority) TicketKeyStore {
	return optionalOr[TicketKeyStore](a)
}

var _ TicketKeyStore = (*store)(nil)

// The ticket key table is schema step 3 (migrate.go). A row's period is
// the start of its rotation period in Unix milliseconds (not a period
// number), so two periods of different lengths never share a row.
func init() {
	addMigration(3, "TLS session ticket keys", func(d dialect) []string {
		return []string{`CREATE TABLE IF NOT EXISTS fy_tls_ticket_keys (
			period_ms BIGINT PRIMARY KEY,
			ticket_key ` + d.blob + ` NOT NULL,
			created_ms BIGINT NOT NULL)`}
	})
}

func (s *store) TicketKeys(ctx context.Context, now time.Time, period time.Duration) ([][32]byte, error) {
	if period < MinTicketKeyPeriod {
		return nil, fmt.Errorf("authority: ticket key rotation period %s is shorter than %s", period, MinTicketKeyPeriod)
	}
	if ms(now) < 0 {
		return nil, fmt.Errorf("authority: ticket keys: time %s is before 1970", now)
	}
	p := period.Milliseconds()
	cur := ms(now) / p * p
	oldest := cur - TicketKeysKept*p
	type row struct {
		period int64
		key    [32]byte
	}
	var rows []row
	err := s.tx(ctx, func(t *sql.Tx) error {
		rows = rows[:0]
		for _, start := range []int64{cur, cur + p} {
			var k [32]byte
			if _, err := rand.Read(k[:]); err != nil {
				return fmt.Errorf("authority: ticket key: %w", err)
			}
			if _, err := s.exec(ctx, t, `INSERT INTO fy_tls_ticket_keys (period_ms, ticket_key, created_ms) VALUES (?, ?, ?)
				ON CONFLICT (period_ms) DO NOTHING`, start, k[:], ms(now)); err != nil {
				return err
			}
		}
		if _, err := s.exec(ctx, t, `DELETE FROM fy_tls_ticket_keys WHERE period_ms < ?`, oldest); err != nil {
			return err
		}
		rs, err := t.QueryContext(ctx, s.rebind(`SELECT period_ms, ticket_key FROM fy_tls_ticket_keys WHERE period_ms >= ? AND period_ms <= ?`), oldest, cur+p)
		if err != nil {
			return err
		}
		defer rs.Close()
		for rs.Next() {
			var r row
			var b []byte
			if err := rs.Scan(&r.period, &b); err != nil {
				return err
			}
			if len(b) != len(r.key) {
				return fmt.Errorf("authority: ticket key of period %s holds %d bytes, want %d", fromMs(r.period).Format(time.RFC3339), len(b), len(r.key))
			}
			copy(r.key[:], b)
			rows = append(rows, r)
		}
		return rs.Err()
	})
	if err != nil {
		return nil, err
	}
	// Current, next, then the rest newest first.
	rank := func(r row) int64 {
		switch r.period {
		case cur:
			return 1 << 62
		case cur + p:
			return 1<<62 - 1
		}
		return r.period
	}
	slices.SortFunc(rows, func(a, b row) int { return cmpDesc(rank(a), rank(b)) })
	if len(rows) < 2 || rows[0].period != cur {
		return nil, errors.New("authority: ticket keys: the current period's key is missing after writing it")
	}
	out := make([][32]byte, len(rows))
	for i, r := range rows {
		out[i] = r.key
	}
	return out, nil
}

func cmpDesc(a, b int64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}
