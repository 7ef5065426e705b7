package cas

// The family-generic suite lives in wire/internal/familytest; this package's
// own test file defines testFamily, testPrefix, badEncodings,
// invalidMessages and maximalMessages.

import (
	"testing"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/familytest"
)

type badEncoding struct {
	name string
	m    wire.Message
	want error
}

type invalidMessage struct {
	name string
	m    wire.Message
}

func TestFamily(t *testing.T) {
	var bad []familytest.BadEncoding
	for _, b := range badEncodings() {
		bad = append(bad, familytest.BadEncoding{Name: b.name, M: b.m, Want: b.want})
	}
	var invalid []familytest.Invalid
	for _, v := range invalidMessages() {
		invalid = append(invalid, familytest.Invalid{Name: v.name, M: v.m})
	}
	familytest.Run(t, familytest.Family{Family: testFamily, Prefix: testPrefix, Messages: Messages, Samples: Samples,
		BadEncodings: bad, Invalid: invalid, Maximal: maximalMessages()})
}
