package cas

import (
	"errors"
	"fmt"

	"forgeyard.dev/transport/wire"
	wcas "forgeyard.dev/transport/wire/cas"
)

// Alike in shape to the other packages' sentinel-error blocks, but these are
// this package's own failures, each a stable API value: they stay apart.

// Store and local errors. They are stable sentinels: compare with errors.Is.
var (
	// ErrUnsupportedAlgorithm: the object's digest algorithm has no
	// implementation in this build (BLAKE3).
	ErrUnsupportedAlgorithm = errors.New("cas: unsupported digest algorithm")
	// ErrNotFound: the store holds no complete object with that reference.
	ErrNotFound = errors.New("cas: object not found")
	// ErrExists: Create was called for an object the store already holds.
	ErrExists = errors.New("cas: object already stored")
	// ErrBusy: another transfer holds the object's partial state.
	ErrBusy = errors.New("cas: object transfer already in progress")
	// ErrTooLarge: the object exceeds the store's MaxObjectSize.
	ErrTooLarge = errors.New("cas: object exceeds the size limit")
	// ErrTooManyPartials: the store's MaxPartials open partial objects are
	// in use.
	ErrTooManyPartials = errors.New("cas: too many partial objects")
	// ErrClosed: the partial object was already committed, aborted or
	// closed.
	ErrClosed = errors.New("cas: partial object closed")
	// ErrProtocol: the peer sent something the CAS protocol does not allow
	// at that point (wrong message, bad range, malformed frame). The stream
	// is reset with StreamProtocolError.
	ErrProtocol = errors.New("cas: protocol violation")
	// ErrForbidden: the lease does not authorize the object (§93). An
	// Authorizer returns it (or an error wrapping it) for a permanent
	// refusal; the peer gets CasForbidden.
	ErrForbidden = errors.New("cas: the lease does not authorize this object")
	// ErrAuthUnavailable: the Authorizer could not tell whether the lease
	// may access the object (authority unreachable); retry later.
	ErrAuthUnavailable = errors.New("cas: cannot check the lease's access now")
)

// OutcomeError is returned by Uploader and Downloader when a transfer ended
// with an outcome other than Verified: the peer's CasObjectAckV1 (Remote
// true) or the local verdict on received bytes (Remote false).
// VerifiedOffset is the verified prefix the receiver keeps.
type OutcomeError struct {
	Object         wire.CasObjectRef
	Outcome        wcas.CasOutcome
	VerifiedOffset uint64
	Remote         bool
}

// Error names the object, which side gave the verdict, the outcome and the verified offset.
func (e *OutcomeError) Error() string {
	who := "local"
	if e.Remote {
		who = "peer"
	}
	return fmt.Sprintf("cas: %s: %s verdict %s (verified offset %d)", e.Object, who, e.Outcome, e.VerifiedOffset)
}

// Outcome reports the CAS outcome carried by err (an *OutcomeError in its
// chain), or false.
func Outcome(err error) (wcas.CasOutcome, bool) {
	var oe *OutcomeError
	if errors.As(err, &oe) {
		return oe.Outcome, true
	}
	return 0, false
}
