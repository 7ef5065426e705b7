package authority

import (
	"context"
	"errors"
	"time"

	"forgeyard.dev/transport/wire"
)

// Alike in shape to the other packages' sentinel-error blocks, but these are
// this package's own failures, each a stable API value: they stay apart.

// Identity errors (§20, §224–225). Compare with errors.Is.
var (
	// ErrTokenUnknown: no enrollment token has this hash.
	ErrTokenUnknown = errors.New("authority: enrollment token unknown")
	// ErrTokenUsed: the token was already used to enroll a runner; tokens
	// are one-time.
	ErrTokenUsed = errors.New("authority: enrollment token already used")
	// ErrTokenExpired: the token's expiry passed before it was used.
	ErrTokenExpired = errors.New("authority: enrollment token expired")
	// ErrTokenRevoked: an operator revoked the token before it was used.
	ErrTokenRevoked = errors.New("authority: enrollment token revoked")
)

// Bounds of enrollment token records.
const (
	MaxTokenName   = 128 // EnrollmentToken.Name
	MaxTokenLabels = 64  // EnrollmentToken.Labels entries
	MaxTokenLabel  = 64  // one label
	// MaxCheckCredentials bounds one CheckCredentials call.
	MaxCheckCredentials = 4096
)

// EnrollmentToken is the authority's record of a one-time bootstrap token.
// The token itself is never stored: only its hash (trust.HashEnrollmentToken).
type EnrollmentToken struct {
	Hash      [32]byte
	ID        string   // short public id (trust.EnrollmentTokenID) for listings and revocation
	Name      string   // intended runner name (certificate common name)
	Labels    []string // intended runner labels
	CreatedAt time.Time
	ExpiresAt time.Time
	// Set when used: the runner enrolled with it and when.
	UsedAt time.Time
	Runner wire.RunnerId
	// Revoked by an operator before use.
	Revoked bool
}

// IssuedCertificate records one certificate the daemon issued to a runner
// (enrollment or renewal), so it can be revoked by serial.
type IssuedCertificate struct {
	Serial   string // trust.SerialString: lower-case hex
	Runner   wire.RunnerId
	NotAfter time.Time
	IssuedAt time.Time
	Revoked  bool
	Reason   string
}

// Credential names what a live transport authenticated with: the runner
// and the certificate serial (empty when unknown).
type Credential struct {
	Runner wire.RunnerId
	Serial string
}

// Revocation is CheckCredentials' answer for one credential that lost its
// authority: the runner was disabled, or the certificate serial revoked.
type Revocation struct {
	Credential
	RunnerDisabled bool // otherwise the certificate was revoked
	Reason         string
}

// Identities is the runner-identity part of the authority: enrollment
// tokens, issued certificates and their revocation. Both SQL stores
// (SQLite and PostgreSQL) implement it; obtain it with IdentitiesOf.
// Safe for concurrent use by several daemons sharing one database.
type Identities interface {
	// CreateEnrollmentToken stores a new token (by hash). ErrConflict if
	// the hash or the id exists.
	CreateEnrollmentToken(ctx context.Context, t EnrollmentToken) error
	// ConsumeEnrollmentToken marks the token with hash used by runner at
	// now, atomically: of concurrent calls (on any daemon sharing the
	// database) exactly one succeeds. It returns the token as stored
	// (with UsedAt and Runner set). Errors: ErrTokenUnknown, ErrTokenUsed,
	// ErrTokenExpired (expiry at or before now), ErrTokenRevoked.
	ConsumeEnrollmentToken(ctx context.Context, hash [32]byte, runner wire.RunnerId, now time.Time) (EnrollmentToken, error)
	// RevokeEnrollmentToken revokes an unused token by its public id.
	// ErrNotFound if there is none; ErrTokenUsed if it was already used.
	RevokeEnrollmentToken(ctx context.Context, id string, now time.Time) error
	// EnrollmentTokens lists tokens, newest first, at most limit.
	EnrollmentTokens(ctx context.Context, limit int) ([]EnrollmentToken, error)

	// RecordCertificate records an issued certificate. Recording the
	// same serial again with the same runner is a no-op; another runner
	// is ErrConflict.
	RecordCertificate(ctx context.Context, c IssuedCertificate) error
	// RevokeCertificate revokes a certificate by serial and ends the
	// runner's sessions that the daemons find using it (through
	// CheckCredentials). ErrNotFound if the serial was never recorded.
	RevokeCertificate(ctx context.Context, serial, reason string, now time.Time) error
	// Certificates lists a runner's recorded certificates, newest first.
	Certificates(ctx context.Context, runner wire.RunnerId) ([]IssuedCertificate, error)
	// CheckCredentials returns the credentials among creds (at most
	// MaxCheckCredentials) whose runner is disabled or whose serial is
	// revoked; nil when all are in good standing. Daemons call it
	// periodically for their live transports, which is how a revocation
	// made through one daemon (or the CLI) reaches every daemon sharing
	// the authority (§224).
	CheckCredentials(ctx context.Context, creds []Credential) ([]Revocation, error)
}

// RevocationRevisions is implemented by an authority that can tell, at
// the price of one cheap query, whether a runner may have been disabled or
// a certificate revoked since an earlier answer, so that a daemon's
// periodic revocation check skips the full CheckCredentials pass over its
// live transports while nothing changed. The SQLite store implements it
// (the database's data_version, which commits of other processes — the
// offline CLI — change, and a count of its own revoking writes); the
// PostgreSQL store answers ok false (several daemons write it; they learn
// of revocations by events, WatcherOf). Obtain it with
// RevocationRevisionsOf.
type RevocationRevisions interface {
	// RevocationRevision returns the current revision. Two equal
	// revisions mean that no SetRunnerEnabled and no RevokeCertificate
	// committed between the two calls; a revision read before a check
	// covers every revoking write that the check could not see. ok false:
	// the authority cannot tell, check in full.
	RevocationRevision(ctx context.Context) (rev Revision, ok bool, err error)
}

// Revision is an opaque, comparable revocation revision
// (RevocationRevisions).
type Revision struct{ db, local uint64 }

// RevocationRevisionsOf returns a's RevocationRevisions, or nil. It looks
// through decorators (Unwrapper).
func RevocationRevisionsOf(a Authority) RevocationRevisions {
	return optionalOr[RevocationRevisions](a)
}

// IdentitiesOf returns a's Identities, or nil if the implementation has
// none (a test double, say). Like every XOf lookup it looks through
// decorators (Unwrapper).
func IdentitiesOf(a Authority) Identities {
	return optionalOr[Identities](a)
}

// Unwrapper is implemented by an Authority that decorates another (a
// metrics decorator, say): the optional interfaces (IdentitiesOf,
// InventoryOf, WatcherOf, SweepElectorOf) are looked up on the decorator
// first and then on what Unwrap returns.
type Unwrapper interface {
	Unwrap() Authority
}

// optional finds T on a or, through Unwrapper, on what it decorates.
func optional[T any](a Authority) (T, bool) {
	for a != nil {
		if t, ok := a.(T); ok {
			return t, true
		}
		u, ok := a.(Unwrapper)
		if !ok {
			break
		}
		a = u.Unwrap()
	}
	var zero T
	return zero, false
}

// optionalOr is optional without the flag: what every XOf lookup returns
// (nil when a does not implement T).
func optionalOr[T any](a Authority) T {
	t, _ := optional[T](a)
	return t
}

// WatcherOf returns a's Watcher, or nil (SQLite, a test double).
func WatcherOf(a Authority) Watcher {
	return optionalOr[Watcher](a)
}

// SweepElectorOf returns a's SweepElector, or nil.
func SweepElectorOf(a Authority) SweepElector {
	return optionalOr[SweepElector](a)
}

// Pinger is implemented by an authority that can check cheaply that its
// database answers (the SQL stores: a round trip on one pooled
// connection). The daemon's health prober calls it every few seconds.
type Pinger interface {
	Ping(ctx context.Context) error
}

// PingerOf returns a's Pinger, or nil (a test double).
func PingerOf(a Authority) Pinger {
	return optionalOr[Pinger](a)
}
