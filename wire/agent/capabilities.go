package agent

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/maxsize"
	"forgeyard.dev/transport/wire/postcard"
)

// RunnerCapabilitiesV1 is a runner's capability summary (§51, §94): platform,
// labels, capacity and installed tools. It is a summary by design; it never
// lists objects such as cached CAS ids.
//
//	struct RunnerCapabilitiesV1 {
//	    os: String,                  // ≤ MaxOSName (32) bytes, e.g. "linux"
//	    arch: String,                // ≤ MaxArchName (32) bytes, e.g. "amd64"
//	    labels: Vec<String>,         // ≤ MaxLabels (64) × ≤ MaxLabel (64) bytes
//	    max_parallel: u16,           // execution slots
//	    cpu_millis: u32,             // CPU capacity in millicores
//	    mem_bytes: u64,
//	    disk_bytes: u64,
//	    tools: Vec<String>,          // ≤ MaxTools (64) × ≤ MaxTool (64) bytes
//	}
//
// It is not a message by itself: RegisterAgentV1 and CapabilityUpdateV1
// embed it. Validate: non-empty os and arch, non-empty distinct labels and
// tools within their bounds, max_parallel > 0.
type RunnerCapabilitiesV1 struct {
	OS          string
	Arch        string
	Labels      []string
	MaxParallel uint16
	CPUMillis   uint32
	MemBytes    uint64
	DiskBytes   uint64
	Tools       []string
}

var maxCapabilitiesSize = maxsize.Bytes(MaxOSName) + maxsize.Bytes(MaxArchName) +
	maxsize.Seq(MaxLabels, maxsize.Bytes(MaxLabel)) + maxsize.U16 + maxsize.U32 + maxsize.U64 + maxsize.U64 +
	maxsize.Seq(MaxTools, maxsize.Bytes(MaxTool))

// AppendPostcard appends c.
func (c *RunnerCapabilitiesV1) AppendPostcard(b []byte) []byte {
	b = postcard.AppendString(b, c.OS)
	b = postcard.AppendString(b, c.Arch)
	b = appendStrings(b, c.Labels)
	b = postcard.AppendU16(b, c.MaxParallel)
	b = postcard.AppendU32(b, c.CPUMillis)
	b = postcard.AppendU64(b, c.MemBytes)
	b = postcard.AppendU64(b, c.DiskBytes)
	return appendStrings(b, c.Tools)
}

// DecodePostcard reads c, reusing the capacity of its slices.
func (c *RunnerCapabilitiesV1) DecodePostcard(d *postcard.Decoder) {
	c.OS = d.String(MaxOSName)
	c.Arch = d.String(MaxArchName)
	c.Labels = readStrings(d, c.Labels, MaxLabels, MaxLabel)
	c.MaxParallel = d.U16()
	c.CPUMillis = d.U32()
	c.MemBytes = d.U64()
	c.DiskBytes = d.U64()
	c.Tools = readStrings(d, c.Tools, MaxTools, MaxTool)
}

// validate checks c as a field of the message named msg.
func (c *RunnerCapabilitiesV1) validate(msg string) error {
	if err := checkString(msg, "capabilities.os", c.OS, MaxOSName, true); err != nil {
		return err
	}
	if err := checkString(msg, "capabilities.arch", c.Arch, MaxArchName, true); err != nil {
		return err
	}
	if err := checkStrings(msg, "capabilities.labels", c.Labels, MaxLabels, MaxLabel); err != nil {
		return err
	}
	if c.MaxParallel == 0 {
		return invalid(msg, "capabilities.max_parallel", "zero")
	}
	return checkStrings(msg, "capabilities.tools", c.Tools, MaxTools, MaxTool)
}

// Validate reports the first rule c breaks, as a *ValidationError.
func (c *RunnerCapabilitiesV1) Validate() error { return c.validate("agent.RunnerCapabilitiesV1") }

// CapabilityUpdateV1 replaces the runner's capability snapshot after a
// change (§94–95: a full snapshot; deltas are a later optimization).
//
//	struct CapabilityUpdateV1 { digest: [u8;32], full: RunnerCapabilitiesV1 }
//
// Validate: non-zero digest, valid capabilities. The digest is the agent's
// digest of its canonical snapshot; the wire encoding is not canonical (§56)
// and is never hashed.
type CapabilityUpdateV1 struct {
	Digest wire.CapabilityDigest
	Full   RunnerCapabilitiesV1
}

const nameCapabilityUpdate = "agent.CapabilityUpdateV1"

var maxCapabilityUpdateSize = maxsize.Digest + maxCapabilitiesSize

// MessageType implements wire.Message.
func (*CapabilityUpdateV1) MessageType() wire.MessageTypeId { return MsgCapabilityUpdate }

// AppendPostcard implements wire.Message.
func (m *CapabilityUpdateV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Digest.Digest[:]...)
	return m.Full.AppendPostcard(b)
}

// DecodePostcard implements wire.Message.
func (m *CapabilityUpdateV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadDigest(d, &m.Digest.Digest)
	m.Full.DecodePostcard(d)
}

// Validate implements wire.Message.
func (m *CapabilityUpdateV1) Validate() error {
	if m.Digest.IsZero() {
		return invalid(nameCapabilityUpdate, "digest", "zero digest")
	}
	return m.Full.validate(nameCapabilityUpdate)
}
