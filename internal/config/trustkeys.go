package config

import (
	"errors"
	"strconv"
	"strings"

	"forgeyard.dev/transport/semantics/trust"
)

// The configuration keys of the credential files, by role, as
// WithTrustKeys takes them: trust.FileError's Field (the name of the
// semantics/trust struct field) → the dotted TOML key the operator wrote.
var (
	// ServerTLSKeys: [tls] of the daemon and the relay.
	ServerTLSKeys = map[string]string{"CertFile": "tls.certificate", "KeyFile": "tls.private_key", "ClientCAFile": "tls.client_ca"}
	// AgentCredentialKeys: [control_plane.credential] of the agent.
	AgentCredentialKeys = map[string]string{"CertFile": "control_plane.credential.certificate",
		"KeyFile": "control_plane.credential.private_key", "CAFile": "control_plane.credential.ca"}
	// RelayUpstreamKeys: [upstream] of the relay.
	RelayUpstreamKeys = map[string]string{"CertFile": "upstream.certificate", "KeyFile": "upstream.private_key", "CAFile": "upstream.ca"}
	// EnrollmentKeys: [enrollment] of the daemon.
	EnrollmentKeys = map[string]string{"IssuerCertFile": "enrollment.issuer_certificate", "IssuerKeyFile": "enrollment.issuer_private_key"}
)

// WithTrustKeys rewrites a *trust.FileError in err so that it names the
// configuration key (keys[Field], e.g. tls.certificate) instead of the Go
// field (CertFile): `tls.certificate "/nope/server.pem": file not found:
// …`. The error still unwraps to the trust sentinels and the cause. Any
// other error is returned as it is.
func WithTrustKeys(err error, keys map[string]string) error {
	var fe *trust.FileError
	if !errors.As(err, &fe) {
		return err
	}
	key, ok := keys[fe.Field]
	if !ok {
		return err
	}
	return &keyedFileError{key: key, fe: fe, keys: keys}
}

// keyedFileError is a trust.FileError reported under its configuration key.
type keyedFileError struct {
	key  string
	fe   *trust.FileError
	keys map[string]string
}

func (e *keyedFileError) Error() string {
	path := "(not set)"
	if e.fe.Path != "" {
		path = strconv.Quote(e.fe.Path)
	}
	msg := e.key + " " + path + ": " + e.fe.Kind.Error()
	if e.fe.Cause != nil {
		// A cause such as "KeyFile is set without CertFile" names the
		// other fields: in the operator's terms too.
		words := strings.Split(e.fe.Cause.Error(), " ")
		for i, w := range words {
			if key, ok := e.keys[w]; ok {
				words[i] = key
			}
		}
		msg += ": " + strings.Join(words, " ")
	}
	return msg
}

// Unwrap returns the trust.FileError, so errors.As and errors.Is see it,
// its kind and its cause.
func (e *keyedFileError) Unwrap() error { return e.fe }

// Invalid marks err as a configuration error found while acting on a
// configuration that validated (a configured file that is missing or
// unreadable): commands exit with status 2 for it (cli.ExitCodeOf). The
// message is err's.
func Invalid(err error) error {
	if err == nil {
		return nil
	}
	return &invalidError{err}
}

type invalidError struct{ err error }

func (e *invalidError) Error() string { return e.err.Error() }
func (e *invalidError) Unwrap() error { return e.err }

// IsInvalid reports whether err is a configuration error: a *Error, an
// error marked by Invalid, or a credential file trust refused
// (*trust.FileError).
func IsInvalid(err error) bool {
	var ce *Error
	var ie *invalidError
	var fe *trust.FileError
	return errors.As(err, &ce) || errors.As(err, &ie) || errors.As(err, &fe)
}
