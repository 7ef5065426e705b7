// Package refcount counts the users of a UDP socket the QUIC backends share
// between a listener (or a dialling Transport) and its connections
// (backends/quic's endpoint, backends/webtransport's Listener): the socket
// closes with the last of them, so closing a listener stops accepting
// without cutting established connections.
package refcount

import "sync"

// Users is the count: the owner plus every live connection. Its zero value
// is not ready; use New. It is safe for concurrent use.
type Users struct {
	mu        sync.Mutex
	n         int
	closed    bool // the last user left
	ownerGone bool // Disown was called
}

// New returns a count holding the owner's reference.
func New() *Users { return &Users{n: 1} }

// Acquire adds a connection; false once the count reached zero (the
// socket is closed).
func (u *Users) Acquire() bool { return u.acquire(false) }

// AcquireOwned is Acquire that also fails once the owner is gone
// (Disown): for a dial through a shared Transport.
func (u *Users) AcquireOwned() bool { return u.acquire(true) }

func (u *Users) acquire(needOwner bool) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed || needOwner && u.ownerGone {
		return false
	}
	u.n++
	return true
}

// Disown marks the owner gone and reports whether it still was there (then
// the caller drops the owner's reference with Release). Later calls report
// false.
func (u *Users) Disown() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	owned := !u.ownerGone
	u.ownerGone = true
	return owned
}

// Release drops one reference and reports whether it was the last: the
// caller then closes the socket (once: later calls report false).
func (u *Users) Release() (last bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.n--
	last = u.n == 0 && !u.closed
	if last {
		u.closed = true
	}
	return last
}

// Closed reports whether the last user left.
func (u *Users) Closed() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.closed
}
