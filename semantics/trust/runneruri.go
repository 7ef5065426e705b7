package trust

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/oklog/ulid/v2"

	"forgeyard.dev/transport/wire"
)

// RunnerURIScheme and RunnerURIHost are the scheme and host of the URI SAN
// that binds a certificate to a RunnerId: forgeyard://runner/<ULID>.
const (
	RunnerURIScheme = "forgeyard"
	RunnerURIHost   = "runner"
)

// Errors returned by RunnerIDFromCert and VerifyPeer. Compare with
// errors.Is; the concrete error may carry more detail.
var (
	// ErrNoRunnerURI means the certificate carries no forgeyard://runner/
	// URI SAN.
	ErrNoRunnerURI = errors.New("trust: certificate has no forgeyard://runner/<ULID> URI SAN")
	// ErrMultipleRunnerURIs means the certificate carries more than one
	// forgeyard://runner/ URI SAN; such a certificate is ambiguous and is
	// rejected even if the URIs agree.
	ErrMultipleRunnerURIs = errors.New("trust: certificate has more than one forgeyard://runner/ URI SAN")
	// ErrMalformedRunnerURI means a forgeyard://runner/ URI SAN is not
	// exactly forgeyard://runner/<canonical non-zero ULID>. The concrete
	// error is a *RunnerURIError.
	ErrMalformedRunnerURI = errors.New("trust: malformed forgeyard://runner/ URI SAN")
)

// RunnerURIError reports a malformed runner URI SAN. It unwraps to
// ErrMalformedRunnerURI.
type RunnerURIError struct {
	URI    string // the offending URI as it appears in the certificate
	Reason string // what is wrong with it, for an operator
}

// Error quotes the offending URI SAN and says why it is malformed.
func (e *RunnerURIError) Error() string {
	return fmt.Sprintf("trust: malformed runner URI SAN %q: %s", e.URI, e.Reason)
}

// Unwrap returns ErrMalformedRunnerURI.
func (e *RunnerURIError) Unwrap() error { return ErrMalformedRunnerURI }

// RunnerURI returns the URI SAN forgeyard://runner/<ULID> that binds a
// certificate to id. It returns a fresh *url.URL on every call; the caller
// may modify it. It does not check that id is non-zero; RunnerIDFromCert
// rejects a zero RunnerId.
func RunnerURI(id wire.RunnerId) *url.URL {
	return &url.URL{Scheme: RunnerURIScheme, Host: RunnerURIHost, Path: "/" + id.String()}
}

// isRunnerURI reports whether u claims to be a runner URI: the forgeyard
// scheme and the runner host, compared case-insensitively (DNS-style host
// comparison), so that a near-miss is reported as malformed rather than
// silently ignored.
func isRunnerURI(u *url.URL) bool {
	return strings.EqualFold(u.Scheme, RunnerURIScheme) && strings.EqualFold(u.Hostname(), RunnerURIHost)
}

// parseRunnerURI parses a URI already known to claim to be a runner URI.
func parseRunnerURI(u *url.URL) (wire.RunnerId, error) {
	bad := func(reason string) (wire.RunnerId, error) {
		return wire.RunnerId{}, &RunnerURIError{URI: u.String(), Reason: reason}
	}
	switch {
	case u.Scheme != RunnerURIScheme:
		return bad("scheme must be lower-case " + RunnerURIScheme)
	case u.Host != RunnerURIHost:
		return bad("host must be exactly " + RunnerURIHost + " (no port, lower-case)")
	case u.User != nil:
		return bad("user info is not allowed")
	case u.RawQuery != "" || u.ForceQuery:
		return bad("query is not allowed")
	case u.Fragment != "":
		return bad("fragment is not allowed")
	case u.Opaque != "":
		return bad("opaque URI is not allowed")
	}
	p := u.EscapedPath()
	if !strings.HasPrefix(p, "/") {
		return bad("path must be /<ULID>")
	}
	s := p[1:]
	if len(s) != ulid.EncodedSize {
		return bad(fmt.Sprintf("path must be /<ULID> with a %d-character ULID", ulid.EncodedSize))
	}
	id, err := ulid.ParseStrict(s)
	if err != nil {
		return bad("invalid ULID: " + err.Error())
	}
	if id.String() != s {
		return bad("ULID must be in canonical upper-case form")
	}
	if id == (ulid.ULID{}) {
		return bad("RunnerId must not be the zero ULID")
	}
	return wire.RunnerId{ULID: id}, nil
}

// RunnerIDFromCert returns the RunnerId bound to c by its single
// forgeyard://runner/<ULID> URI SAN.
//
// Errors: ErrNoRunnerURI if there is none (URIs with other schemes or
// hosts do not count), ErrMultipleRunnerURIs if there are several, and a
// *RunnerURIError (errors.Is ErrMalformedRunnerURI) if the one present is
// malformed. It does not verify the certificate; use VerifyPeer for a
// connection, or x509.Certificate.Verify. A nil c yields ErrNoRunnerURI.
func RunnerIDFromCert(c *x509.Certificate) (wire.RunnerId, error) {
	if c == nil {
		return wire.RunnerId{}, ErrNoRunnerURI
	}
	var found *url.URL
	for _, u := range c.URIs {
		if u == nil || !isRunnerURI(u) {
			continue
		}
		if found != nil {
			return wire.RunnerId{}, ErrMultipleRunnerURIs
		}
		found = u
	}
	if found == nil {
		return wire.RunnerId{}, ErrNoRunnerURI
	}
	return parseRunnerURI(found)
}
