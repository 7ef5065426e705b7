// Package registry assembles the message registry of every protocol family
// (§158–160): the one table that maps a MessageTypeId on the wire to its Go
// type, name, first protocol version, size bound and sensitivity.
//
// Default is what the transport decodes envelopes with. Samples returns one
// or more deterministic instances of every registered type; the golden
// vectors (wire/vectors), the fuzz seed corpora and the protocol inspector
// are built from them. docs/protocols/internal/registry.md is generated from
// Default by `go test ./wire/registry -run Registry -update`, and the test
// fails when that document is stale.
//
// Which families a peer role may use (AllowedFamilies) belongs to the
// session layer, not here.
package registry

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/admin"
	"forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/cas"
	"forgeyard.dev/transport/wire/device"
	"forgeyard.dev/transport/wire/health"
	"forgeyard.dev/transport/wire/logs"
	"forgeyard.dev/transport/wire/signing"
)

// Family is one protocol family as registered: its number, its message
// table and its samples. Values returned by Families are shared; the caller
// must not modify Messages.
type Family struct {
	Family   wire.Family
	Messages []wire.MessageInfo
	// Samples returns fresh deterministic instances of the family's
	// messages: at least one per registered type, identical on every call.
	Samples func() []wire.Message
}

// Name returns the family's lowercase name, e.g. "agent". It is also the
// prefix of every message name in the family and the name of the family's
// golden vector file.
func (f Family) Name() string { return f.Family.String() }

// families lists every family compiled into this build, in family order.
// A family is added here as soon as its package exists; the tests check
// that every entry's messages carry the entry's family number.
var families = []Family{
	{Family: wire.FamilyCommon, Messages: wire.CommonMessages, Samples: commonSamples},
	{Family: wire.FamilyAgent, Messages: agent.Messages, Samples: agent.Samples},
	{Family: wire.FamilyLogs, Messages: logs.Messages, Samples: logs.Samples},
	{Family: wire.FamilyCas, Messages: cas.Messages, Samples: cas.Samples},
	{Family: wire.FamilyHealth, Messages: health.Messages, Samples: health.Samples},
	{Family: wire.FamilyAdmin, Messages: admin.Messages, Samples: admin.Samples},
	{Family: wire.FamilySigning, Messages: signing.Messages, Samples: signing.Samples},
	{Family: wire.FamilyDevice, Messages: device.Messages, Samples: device.Samples},
}

// Default is the registry of every family in this build. It is immutable
// and safe for concurrent use.
var Default = newDefault()

func newDefault() *wire.Registry {
	lists := make([][]wire.MessageInfo, len(families))
	for i, f := range families {
		lists[i] = f.Messages
	}
	return wire.MustRegistry(lists...)
}

// Families returns the registered families in family-number order. The
// slice is a copy; the message tables in it are shared and read-only.
func Families() []Family {
	return append([]Family(nil), families...)
}

// Samples returns deterministic instances of every registered message, in
// family order and within a family in the family's own order. Every call
// returns fresh values, so callers may modify them.
func Samples() []wire.Message {
	var out []wire.Message
	for _, f := range families {
		out = append(out, f.Samples()...)
	}
	return out
}

// commonSamples covers wire.CommonMessages, which has no samples of its own
// in the wire package.
func commonSamples() []wire.Message {
	return []wire.Message{
		&wire.WireErrorV1{Code: wire.ErrCodeStaleLease, Retry: wire.RetryResync, Message: "lease superseded by a newer attempt"},
		// A code this build does not know: a newer peer may send one, and it
		// must still decode and validate (§263).
		&wire.WireErrorV1{Code: 999, Retry: wire.RetryNever, Message: ""},
	}
}
