package authority

import (
	"context"
	"time"
)

// Clock is implemented by an authority whose database keeps the clock of
// lease expiry: the PostgreSQL store, shared by several daemons whose wall
// clocks may disagree. Every lease time in such an authority (a lease's
// CreatedAt and ExpiresAt, the `now` of RenewLease and Resync, the
// `before` of ExpiredLeases and ExpireLease) is meant on the database's
// clock: a daemon reads DatabaseNow, keeps the offset to its own clock,
// and passes database times, so daemons with skewed clocks write and
// judge the same expiries (docs/protocols/internal/leases.md, "Clock").
// The store itself takes the times it is given: it never reads a clock.
//
// The SQLite store does not implement it (ClockOf returns nil): its
// database is a file of one daemon's host, whose clock is the daemon's.
type Clock interface {
	// DatabaseNow returns the database server's current time
	// (PostgreSQL clock_timestamp()).
	DatabaseNow(ctx context.Context) (time.Time, error)
}

// ClockOf returns a's database clock, or nil when lease times are the
// daemon's own clock (SQLite, a test double).
func ClockOf(a Authority) Clock {
	c, ok := optional[Clock](a)
	if !ok {
		return nil
	}
	if s, ok := c.(*store); ok && !s.d.dollar {
		return nil // SQLite
	}
	return c
}

// DatabaseNow implements Clock (PostgreSQL; SQLite answers the local
// clock, but ClockOf hides it).
func (s *store) DatabaseNow(ctx context.Context) (time.Time, error) {
	if !s.d.dollar {
		return time.Now(), nil
	}
	var t time.Time
	if err := s.read(func() error { return s.db.QueryRowContext(ctx, `SELECT clock_timestamp()`).Scan(&t) }); err != nil {
		return time.Time{}, err
	}
	return t, nil
}

var _ Clock = (*store)(nil)
