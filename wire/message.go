package wire

import (
	"fmt"
	"log/slog"
	"sort"

	"forgeyard.dev/transport/wire/internal/enum"
	"forgeyard.dev/transport/wire/postcard"
)

// Family is a protocol family (§29). On the wire an envelope's payload is a
// two-level Postcard enum: varint(family) then varint(variant) then the
// message. Values are explicit and never reused (§54, §160).
type Family uint8

// Protocol families.
const (
	FamilyCommon  Family = 0 // errors shared by every family
	FamilyAgent   Family = 1 // agent control (§41)
	FamilyLogs    Family = 2 // log streams (§83–86)
	FamilyCas     Family = 3 // CAS transfer (§87–93)
	FamilyHealth  Family = 4 // health (§96)
	FamilyAdmin   Family = 5 // typed admin commands (§97–98)
	FamilySigning Family = 6 // signing worker (§99)
	FamilyDevice  Family = 7 // device agent (§100)

	NumFamilies = 8
)

var familyNames = [NumFamilies]string{"common", "agent", "logs", "cas", "health", "admin", "signing", "device"}

// String returns the family's name (agent, logs, …), or family(n) for an unknown number.
func (f Family) String() string { return enum.Name(familyNames[:], f, "family") }

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (f Family) LogValue() slog.Value { return slog.StringValue(f.String()) }

// MessageTypeId is a message's stable type number (§159): family<<8 | variant.
type MessageTypeId uint16

// TypeID builds a MessageTypeId.
func TypeID(f Family, variant uint8) MessageTypeId {
	return MessageTypeId(uint16(f)<<8 | uint16(variant))
}

// Family returns the type's family.
func (t MessageTypeId) Family() Family { return Family(t >> 8) }

// Variant returns the type's variant number within its family.
func (t MessageTypeId) Variant() uint8 { return uint8(t) }

// String returns the type number as four hex digits, e.g. 0x0101.
func (t MessageTypeId) String() string { return fmt.Sprintf("0x%04x", uint16(t)) }

// Message is a V1 wire message: one variant of one family's enum.
// Implementations are plain structs; AppendPostcard never allocates beyond
// growing b, and DecodePostcard enforces every documented bound through the
// decoder (errors are sticky in d). Validate checks the rules that the wire
// encoding cannot express (non-zero identifiers, ranges) and is the step
// between a decoded wire value and a domain value (§260).
type Message interface {
	MessageType() MessageTypeId
	AppendPostcard(b []byte) []byte
	DecodePostcard(d *postcard.Decoder)
	Validate() error
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (t MessageTypeId) LogValue() slog.Value { return slog.StringValue(t.String()) }

// MessageInfo describes one registered message type.
type MessageInfo struct {
	Type      MessageTypeId
	Name      string          // e.g. "agent.LeaseOfferV1"
	Since     ProtocolVersion // first protocol version that carries it
	MaxSize   int             // bound on the encoded message body, in bytes
	Sensitive bool            // carries secret material: never printed
	New       func() Message
}

// Registry maps type numbers to message descriptions. It is immutable after
// construction and safe for concurrent use.
type Registry struct {
	byType map[MessageTypeId]*MessageInfo
	all    []MessageInfo
}

// NewRegistry builds a registry from the given lists and rejects duplicate
// type numbers or names, and entries whose New returns a mismatched type.
func NewRegistry(lists ...[]MessageInfo) (*Registry, error) {
	r := &Registry{byType: map[MessageTypeId]*MessageInfo{}}
	names := map[string]bool{}
	for _, l := range lists {
		r.all = append(r.all, l...)
	}
	sort.Slice(r.all, func(i, j int) bool { return r.all[i].Type < r.all[j].Type })
	for i := range r.all {
		mi := &r.all[i]
		if _, dup := r.byType[mi.Type]; dup {
			return nil, fmt.Errorf("wire: duplicate message type %s (%s)", mi.Type, mi.Name)
		}
		if names[mi.Name] {
			return nil, fmt.Errorf("wire: duplicate message name %s", mi.Name)
		}
		if got := mi.New().MessageType(); got != mi.Type {
			return nil, fmt.Errorf("wire: %s registered as %s but reports %s", mi.Name, mi.Type, got)
		}
		names[mi.Name] = true
		r.byType[mi.Type] = mi
	}
	return r, nil
}

// MustRegistry is NewRegistry that panics on error; for package-level tables.
func MustRegistry(lists ...[]MessageInfo) *Registry {
	r, err := NewRegistry(lists...)
	if err != nil {
		panic(err)
	}
	return r
}

// Lookup returns the description of t.
func (r *Registry) Lookup(t MessageTypeId) (*MessageInfo, bool) {
	mi, ok := r.byType[t]
	return mi, ok
}

// All returns every registered message, ordered by type number. The caller
// must not modify the returned slice.
func (r *Registry) All() []MessageInfo { return r.all }

// AppendMessage appends the two-level payload enum: varint(family),
// varint(variant), then the message body.
func AppendMessage(b []byte, m Message) []byte {
	t := m.MessageType()
	b = postcard.AppendVariant(b, uint32(t.Family()))
	b = postcard.AppendVariant(b, uint32(t.Variant()))
	return m.AppendPostcard(b)
}

// UnknownMessageError reports a well-formed family/variant pair that the
// registry does not know. Minor-compatible peers may skip such a frame where
// the family allows it (§53); otherwise it is a protocol error.
type UnknownMessageError struct {
	Type MessageTypeId
}

// Error names the unknown message type number.
func (e *UnknownMessageError) Error() string {
	return "wire: unknown message type " + e.Type.String()
}

// DecodeMessage reads a payload enum and its body with the registry. The body
// must fill the rest of the input exactly.
func (r *Registry) DecodeMessage(d *postcard.Decoder) (Message, error) {
	fam := d.U32()
	variant := d.U32()
	if err := d.Err(); err != nil {
		return nil, err
	}
	if fam >= 256 || variant >= 256 {
		return nil, &UnknownMessageError{Type: 0xffff}
	}
	t := TypeID(Family(fam), uint8(variant))
	mi, ok := r.byType[t]
	if !ok {
		return nil, &UnknownMessageError{Type: t}
	}
	if d.Remaining() > mi.MaxSize {
		return nil, &postcard.Error{Code: postcard.CodeLengthOverBound, Offset: d.Offset(), Detail: mi.Name}
	}
	m := mi.New()
	m.DecodePostcard(d)
	if err := d.Finish(); err != nil {
		return nil, err
	}
	return m, nil
}
