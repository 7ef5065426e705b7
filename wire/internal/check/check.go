// Package check holds the validation rules that several message families
// share word for word (logs, cas, health, admin, signing, device), so that
// a rule and its error read the same in every family. It is wire's own (no
// promise).
package check

import (
	"fmt"
	"unicode/utf8"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

// Invalid reports a Validate failure of the named family, "<family>:
// <what> (invalid value)"; it matches postcard.ErrInvalidValue under
// errors.Is. what is static text, never a value taken from the message.
func Invalid(family, what string) error {
	return fmt.Errorf("%s: %s (%w)", family, what, postcard.ErrInvalidValue)
}

// Text reports whether s is at most max bytes of valid UTF-8 and, when
// required, non-empty.
func Text(s string, max int, required bool) bool {
	return len(s) <= max && (!required || s != "") && utf8.ValidString(s)
}

// ValidRef reports whether r names a known digest algorithm and a non-zero
// digest. Any size is valid (an empty object has size 0 and a non-zero
// digest).
func ValidRef(r *wire.CasObjectRef) bool {
	return (r.Algorithm == wire.DigestSHA256 || r.Algorithm == wire.DigestBLAKE3) && !r.Digest.IsZero()
}
