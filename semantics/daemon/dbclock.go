package daemon

import (
	"context"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/semantics/authority"
)

// Lease times are on the authority's clock (issue 15 item 2): with a
// shared PostgreSQL authority (authority.Clock), the database's clock,
// so daemons whose wall clocks disagree write and judge the same lease
// expiries; with SQLite (one daemon per file) the daemon's own clock.
//
// The daemon reads the database clock (SELECT clock_timestamp()) at New
// and at every sweep, and keeps the offset to its own clock (the reading
// against the midpoint of the round trip). It then:
//
//   - writes lease times on the database clock (authNow: an offer's
//     CreatedAt and ExpiresAt, the `now` of RenewLease and Resync, from
//     which the store extends the expiry);
//   - judges expiry on it: the sweep lists and expires leases against the
//     database time it has just read (not an offset), and the other checks
//     (adoption of offers made elsewhere, secrets) against authNow;
//   - tells agents expiry times on its own clock (toLocal): the agent
//     relates them to the daemon's clock (ServerTimeV1, agent clock.go).
//
// The agreement between daemons is the database's: two daemons differ by
// their offset errors (about half a round trip plus the drift between two
// sweeps), not by their clocks' skew.
type dbClock struct {
	c      authority.Clock // nil: lease times are the daemon's clock
	offset atomic.Int64    // nanoseconds: database clock − daemon clock
}

// initDBClock finds the authority's clock and reads it once (a failure is
// logged; the offset stays 0 until a sweep reads it).
func (d *Daemon) initDBClock() {
	d.dbc.c = authority.ClockOf(d.auth)
	if d.dbc.c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.timing.RequestTimeout)
	defer cancel()
	if _, err := d.readDBClock(ctx); err != nil {
		d.log.Warn("cannot read the authority's clock; lease times use this daemon's clock until it answers", "err", err)
	}
}

// readDBClock reads the database clock, updates the offset and returns
// the database time. Without an authority clock it returns the daemon's.
func (d *Daemon) readDBClock(ctx context.Context) (time.Time, error) {
	c := d.dbc.c
	if c == nil {
		return d.now(), nil
	}
	t0 := d.now()
	db, err := c.DatabaseNow(ctx)
	t1 := d.now()
	if err != nil {
		return time.Time{}, err
	}
	d.dbc.offset.Store(int64(db.Sub(t0.Add(t1.Sub(t0) / 2))))
	return db, nil
}

// authNow is the current time on the authority's clock.
func (d *Daemon) authNow() time.Time {
	return d.now().Add(time.Duration(d.dbc.offset.Load()))
}

// toAuth converts a time of the daemon's clock to the authority's.
func (d *Daemon) toAuth(t time.Time) time.Time {
	return t.Add(time.Duration(d.dbc.offset.Load()))
}

// toLocal converts an authority time to the daemon's clock.
func (d *Daemon) toLocal(t time.Time) time.Time {
	return t.Add(-time.Duration(d.dbc.offset.Load()))
}
