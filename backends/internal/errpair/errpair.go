// Package errpair is the backend-neutral half of the QUIC backends' error
// translation (backends/quic, backends/webtransport): a semantics error
// paired with the library error it came from. Each backend embeds Pair in
// its own unexported type, so that each recognises only the errors it
// translated itself.
package errpair

import "strings"

// Pair carries a semantics error (*semantics.StreamError or
// *semantics.ConnError) and the library error it came from. Error reads
// like the semantics error (with the original in parentheses unless it
// already says it); Unwrap exposes both.
type Pair struct {
	Sem  error
	Orig error
}

func (e *Pair) Error() string {
	s, o := e.Sem.Error(), e.Orig.Error()
	if strings.Contains(s, o) {
		return s
	}
	return s + " (" + o + ")"
}

// Unwrap returns the semantics error and the original.
func (e *Pair) Unwrap() []error { return []error{e.Sem, e.Orig} }
