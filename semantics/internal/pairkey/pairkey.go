// Package pairkey reads the names of the objects semantics/cas' and
// semantics/logs' bucket stores list back: "<dir><a>-<b>" with two decimal
// numbers (a CAS chunk's offset and size, a log segment's first and last
// sequence number). It is semantics' own, so that the two data paths share
// one copy without importing each other.
package pairkey

import (
	"strconv"
	"strings"
)

// Split returns the two numbers of key, an object listed under dir; ok is
// false for a key not of that form. What the numbers must satisfy is the
// caller's to check.
func Split(key, dir string) (a, b uint64, ok bool) {
	as, bs, ok := strings.Cut(strings.TrimPrefix(key, dir), "-")
	a, err1 := strconv.ParseUint(as, 10, 64)
	b, err2 := strconv.ParseUint(bs, 10, 64)
	return a, b, ok && err1 == nil && err2 == nil
}
