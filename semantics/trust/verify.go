package trust

import (
	"crypto/tls"
	"fmt"
	"time"

	"forgeyard.dev/transport/wire"
)

// Identity is what a verified agent certificate proves: the runner it is
// bound to and how long that proof lasts. Successful TLS authentication does
// not make a runner ready; the agent must still register (§18).
type Identity struct {
	// Runner is the RunnerId from the leaf's forgeyard://runner/ URI SAN.
	Runner wire.RunnerId
	// NotAfter is when the identity stops being valid: the earliest
	// NotAfter in the verified chain (leaf, intermediates, root).
	NotAfter time.Time
	// Subject is the leaf's subject distinguished name, for logs only;
	// authorization must use Runner.
	Subject string
}

// VerifyPeer returns the Identity proven by the peer of a completed TLS
// connection, taken from the first verified chain (cs.VerifiedChains[0][0]
// is the verified leaf). The unverified cs.PeerCertificates are never
// consulted.
//
// It checks validity against now as well, so a caller holding a long-lived
// connection state can re-check it later (the handshake already rejected
// certificates expired at handshake time; the daemon rejects expired
// credentials, §22).
//
// Errors: ErrHandshakeIncomplete, ErrNoVerifiedChain, ErrCertExpired or
// ErrCertNotYetValid (wrapped with dates), or any error of
// RunnerIDFromCert (ErrNoRunnerURI, ErrMultipleRunnerURIs,
// *RunnerURIError).
func VerifyPeer(cs tls.ConnectionState, now time.Time) (Identity, error) {
	if !cs.HandshakeComplete {
		return Identity{}, ErrHandshakeIncomplete
	}
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 || cs.VerifiedChains[0][0] == nil {
		return Identity{}, ErrNoVerifiedChain
	}
	chain := cs.VerifiedChains[0]
	leaf := chain[0]
	notAfter := leaf.NotAfter
	for _, c := range chain {
		if c == nil {
			return Identity{}, ErrNoVerifiedChain
		}
		if now.Before(c.NotBefore) {
			return Identity{}, fmt.Errorf("trust: peer %w: %q valid only from %s", ErrCertNotYetValid, c.Subject.String(), c.NotBefore.UTC().Format(time.RFC3339))
		}
		if c.NotAfter.Before(notAfter) {
			notAfter = c.NotAfter
		}
	}
	if now.After(notAfter) {
		return Identity{}, fmt.Errorf("trust: peer %w: expired at %s", ErrCertExpired, notAfter.UTC().Format(time.RFC3339))
	}
	id, err := RunnerIDFromCert(leaf)
	if err != nil {
		return Identity{}, err
	}
	return Identity{Runner: id, NotAfter: notAfter, Subject: leaf.Subject.String()}, nil
}
