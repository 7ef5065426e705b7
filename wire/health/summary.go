package health

import (
	"log/slog"
	"strconv"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/check"
	"forgeyard.dev/transport/wire/internal/enum"
	"forgeyard.dev/transport/wire/internal/seq"
	"forgeyard.dev/transport/wire/postcard"
)

// Bounds of a health summary, in bytes or elements.
const (
	MaxCheckName    = 64  // HealthCheckV1.Name, bytes
	MaxCheckMessage = 256 // HealthCheckV1.Message, bytes
	MaxChecks       = 32  // HealthSummaryV1.Checks, elements
)

// HealthStatus is a health verdict, ordered from best to worst. Postcard enum.
type HealthStatus uint32

// Health statuses.
const (
	Healthy   HealthStatus = 0 // everything works
	Degraded  HealthStatus = 1 // works, with reduced capacity or a failing optional check
	Unhealthy HealthStatus = 2 // cannot do its work

	numHealthStatuses = 3
)

// String returns Healthy, Degraded or Unhealthy.
func (s HealthStatus) String() string { return enum.Name(healthStatusNames[:], s, "HealthStatus") }

var healthStatusNames = [...]string{
	Healthy: "Healthy", Degraded: "Degraded", Unhealthy: "Unhealthy",
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (s HealthStatus) LogValue() slog.Value { return slog.StringValue(s.String()) }

// HealthCheckV1 is the result of one named check.
//
//	struct HealthCheckV1 {
//	    name: String,          // 1..=64 bytes, unique within a summary
//	    status: HealthStatus,  // Healthy=0, Degraded=1, Unhealthy=2
//	    message: String,       // ≤ 256 bytes of operator text; no secrets (§212)
//	}
type HealthCheckV1 struct {
	Name    string
	Status  HealthStatus
	Message string
}

const healthCheckMinSize = 1 + 1 + 1

func (c *HealthCheckV1) appendPostcard(b []byte) []byte {
	b = postcard.AppendString(b, c.Name)
	b = postcard.AppendVariant(b, uint32(c.Status))
	return postcard.AppendString(b, c.Message)
}

func (c *HealthCheckV1) decodePostcard(d *postcard.Decoder) {
	c.Name = d.String(MaxCheckName)
	c.Status = HealthStatus(d.Variant(numHealthStatuses))
	c.Message = d.String(MaxCheckMessage)
}

func (c *HealthCheckV1) validate() error {
	if !check.Text(c.Name, MaxCheckName, true) {
		return errInvalid("health check: name must be 1..=64 bytes of UTF-8")
	}
	if c.Status >= numHealthStatuses {
		return errInvalid("health check: unknown status")
	}
	if !check.Text(c.Message, MaxCheckMessage, false) {
		return errInvalid("health check: message must be ≤ 256 bytes of UTF-8")
	}
	return nil
}

// HealthSummaryV1 is a peer's health report (§96): an overall status, the
// checks behind it, and the reporter's uptime in milliseconds.
//
//	struct HealthSummaryV1 {
//	    status: HealthStatus,        // at least as bad as the worst check
//	    checks: Vec<HealthCheckV1>,  // ≤ 32
//	    uptime_ms: u64,
//	}
type HealthSummaryV1 struct {
	Status   HealthStatus
	Checks   []HealthCheckV1
	UptimeMs uint64
}

// MessageType implements wire.Message.
func (*HealthSummaryV1) MessageType() wire.MessageTypeId { return MsgHealthSummary }

// AppendPostcard implements wire.Message.
func (m *HealthSummaryV1) AppendPostcard(b []byte) []byte {
	b = postcard.AppendVariant(b, uint32(m.Status))
	b = seq.Append(b, m.Checks, (*HealthCheckV1).appendPostcard)
	return postcard.AppendU64(b, m.UptimeMs)
}

// DecodePostcard implements wire.Message. It reuses the capacity of m.Checks.
func (m *HealthSummaryV1) DecodePostcard(d *postcard.Decoder) {
	m.Status = HealthStatus(d.Variant(numHealthStatuses))
	for c := range seq.Decode(d, &m.Checks, MaxChecks, healthCheckMinSize) {
		c.decodePostcard(d)
	}
	m.UptimeMs = d.U64()
}

// Validate implements wire.Message: statuses known, at most MaxChecks checks
// with unique non-empty names within their bounds, and the overall status at
// least as bad as the worst check.
func (m *HealthSummaryV1) Validate() error {
	if m.Status >= numHealthStatuses {
		return errInvalid("health summary: unknown status")
	}
	if len(m.Checks) > MaxChecks {
		return errInvalid("health summary: more than 32 checks")
	}
	for i := range m.Checks {
		c := &m.Checks[i]
		if err := c.validate(); err != nil {
			return err
		}
		if c.Status > m.Status {
			return errInvalid("health summary: status better than check " + strconv.Quote(c.Name))
		}
		for j := range i {
			if m.Checks[j].Name == c.Name {
				return errInvalid("health summary: duplicate check name")
			}
		}
	}
	return nil
}
