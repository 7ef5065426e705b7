package authority

import (
	"context"
	"errors"
)

// MaxLiveLeases bounds LiveLister.LiveLeases.
const MaxLiveLeases = 100000

// ErrTooManyLiveLeases: more leases are live than LiveLeases may list;
// the list is incomplete, so nothing may be deleted on its strength.
var ErrTooManyLiveLeases = errors.New("authority: more live leases than MaxLiveLeases")

// LiveLister is implemented by the SQL stores. LiveLeases lists every live
// (offered or accepted) lease of every agent session, whichever daemon
// holds the session: what daemons sharing one data plane must all keep
// (semantics/retention; issue 15 item 5). A daemon alone only knows the
// leases of the sessions connected to it.
type LiveLister interface {
	// LiveLeases returns the live leases, at most MaxLiveLeases of them;
	// with more it returns ErrTooManyLiveLeases and no list.
	LiveLeases(ctx context.Context) ([]Lease, error)
}

// LiveListerOf returns a's LiveLister, or nil (a test double).
func LiveListerOf(a Authority) LiveLister {
	return optionalOr[LiveLister](a)
}

func (s *store) LiveLeases(ctx context.Context) ([]Lease, error) {
	// The (state, expires_ms) index serves the state filter.
	return s.queryLeases(ctx, `SELECT `+leaseCols+` FROM fy_leases WHERE state IN (?, ?) LIMIT ?`,
		[]any{string(LeaseOffered), string(LeaseAccepted), MaxLiveLeases + 1}, MaxLiveLeases)
}
