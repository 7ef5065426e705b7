package health

import (
	"log/slog"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/enum"
	"forgeyard.dev/transport/wire/postcard"
)

// ProbeKind selects a health probe. Postcard enum.
type ProbeKind uint32

// Probe kinds.
const (
	ProbeConnectivity ProbeKind = 0 // reachability of the daemon endpoints and relays
	ProbeDisk         ProbeKind = 1 // free space and writability of work and cache directories
	ProbeClock        ProbeKind = 2 // clock offset against the daemon's server time
	ProbeFull         ProbeKind = 3 // every probe above

	numProbeKinds = 4
)

// String returns the probe kind's name (Connectivity, Disk, …).
func (k ProbeKind) String() string { return enum.Name(probeKindNames[:], k, "ProbeKind") }

var probeKindNames = [...]string{
	ProbeConnectivity: "Connectivity", ProbeDisk: "Disk", ProbeClock: "Clock", ProbeFull: "Full",
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (k ProbeKind) LogValue() slog.Value { return slog.StringValue(k.String()) }

// Valid reports whether k is a probe kind this build knows.
func (k ProbeKind) Valid() bool { return k < numProbeKinds }

// AppendPostcard appends k as its enum discriminant.
func (k ProbeKind) AppendPostcard(b []byte) []byte { return postcard.AppendVariant(b, uint32(k)) }

// DecodeProbeKind reads a ProbeKind; an unknown discriminant fails with
// postcard.ErrBadEnum.
func DecodeProbeKind(d *postcard.Decoder) ProbeKind { return ProbeKind(d.Variant(numProbeKinds)) }

// ProbeRequestV1 asks a peer to run one probe now (§96); it answers with
// ProbeResponseV1.
//
//	struct ProbeRequestV1 { probe: ProbeKind }  // Connectivity=0, Disk=1, Clock=2, Full=3
type ProbeRequestV1 struct {
	Probe ProbeKind
}

// MessageType implements wire.Message.
func (*ProbeRequestV1) MessageType() wire.MessageTypeId { return MsgProbeRequest }

// AppendPostcard implements wire.Message.
func (m *ProbeRequestV1) AppendPostcard(b []byte) []byte { return m.Probe.AppendPostcard(b) }

// DecodePostcard implements wire.Message.
func (m *ProbeRequestV1) DecodePostcard(d *postcard.Decoder) { m.Probe = DecodeProbeKind(d) }

// Validate implements wire.Message: the probe kind must be known.
func (m *ProbeRequestV1) Validate() error {
	if !m.Probe.Valid() {
		return errInvalid("probe request: unknown probe kind")
	}
	return nil
}

// ProbeResponseV1 carries the result of a probe: the health summary it
// produced and how long it took, in milliseconds.
//
//	struct ProbeResponseV1 { probe: ProbeKind, summary: HealthSummaryV1, duration_ms: u32 }
type ProbeResponseV1 struct {
	Probe      ProbeKind
	Summary    HealthSummaryV1
	DurationMs uint32
}

// MessageType implements wire.Message.
func (*ProbeResponseV1) MessageType() wire.MessageTypeId { return MsgProbeResponse }

// AppendPostcard implements wire.Message.
func (m *ProbeResponseV1) AppendPostcard(b []byte) []byte {
	b = m.Probe.AppendPostcard(b)
	b = m.Summary.AppendPostcard(b)
	return postcard.AppendU32(b, m.DurationMs)
}

// DecodePostcard implements wire.Message. It reuses the capacity of
// m.Summary.Checks.
func (m *ProbeResponseV1) DecodePostcard(d *postcard.Decoder) {
	m.Probe = DecodeProbeKind(d)
	m.Summary.DecodePostcard(d)
	m.DurationMs = d.U32()
}

// Validate implements wire.Message: the probe kind must be known and the
// summary valid.
func (m *ProbeResponseV1) Validate() error {
	if !m.Probe.Valid() {
		return errInvalid("probe response: unknown probe kind")
	}
	return m.Summary.Validate()
}
