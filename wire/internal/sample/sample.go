// Package sample builds the fixed identifiers and object references of the
// family packages' Samples (cas, device, logs), so that their samples and
// the golden vectors made from them never depend on the clock or on
// randomness. It is wire's own (no promise); changing a value here changes
// those families' sample bytes.
package sample

import (
	"github.com/oklog/ulid/v2"

	"forgeyard.dev/transport/wire"
)

// ULID returns a fixed ULID: the timestamp 2026-01-01T00:00:00Z and ten
// bytes derived from tag.
func ULID(tag byte) ulid.ULID {
	u := ulid.ULID{0x01, 0x9b, 0x77, 0x2a, 0x3c, 0x00}
	for i := 6; i < len(u); i++ {
		u[i] = tag ^ byte(i*0x11)
	}
	return u
}

// Ref returns a fixed object reference of the given algorithm and size
// whose digest bytes derive from tag.
func Ref(alg wire.DigestAlgorithm, tag byte, size uint64) wire.CasObjectRef {
	r := wire.CasObjectRef{Algorithm: alg, Size: size}
	for i := range r.Digest {
		r.Digest[i] = tag + byte(i*7)
	}
	return r
}
