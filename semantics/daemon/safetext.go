package daemon

import (
	"errors"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/trust"
)

// The texts below are what a peer is told when its input is refused: a
// fixed sentence per stable code and cause, never an internal error's text
// (x509, parser, database or authority messages stay in the daemon's log and
// audit records). Every error reply and rejection the daemon sends carries
// a constant or one of these.
const (
	// msgCertNotTrusted answers a registration whose certificate chain
	// does not verify against the runner CAs.
	msgCertNotTrusted = "authentication failed: certificate not trusted by this daemon"
	// msgAuthorityUnavailable answers any authority failure.
	msgAuthorityUnavailable = "authority unavailable"
)

// authRefusal is the peer's text for a failed certificate check (identity).
func authRefusal(err error) string {
	if errors.Is(err, trust.ErrCertExpired) {
		return trust.MsgCredentialExpired
	}
	return msgCertNotTrusted
}

// csrRefusal is the peer's text for a CSR trust.ParseCSR refused: the
// sentinel's fixed text, never the parser's.
func csrRefusal(err error) string {
	if errors.Is(err, trust.ErrCSRKeyType) {
		return trust.ErrCSRKeyType.Error()
	}
	return trust.ErrBadCSR.Error()
}

// tokenRefusal is the peer's text for an enrollment token the authority
// refused, with what to do about it; false for any other error (nil, or
// the authority's own failure).
func tokenRefusal(err error) (string, bool) {
	switch {
	case errors.Is(err, authority.ErrTokenUnknown):
		return "enrollment token unknown: check it was copied whole, or create a new one (forgeyard runner token create)", true
	case errors.Is(err, authority.ErrTokenUsed):
		return "enrollment token already used: tokens are one-time; create a new one (forgeyard runner token create)", true
	case errors.Is(err, authority.ErrTokenExpired):
		return "enrollment token expired: create a new one (forgeyard runner token create --ttl ...)", true
	case errors.Is(err, authority.ErrTokenRevoked):
		return "enrollment token revoked by an operator", true
	}
	return "", false
}
