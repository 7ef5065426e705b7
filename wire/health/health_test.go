package health

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

const (
	testFamily = wire.FamilyHealth
	testPrefix = "health."
)

func checks(n int, status HealthStatus) []HealthCheckV1 {
	c := make([]HealthCheckV1, n)
	for i := range c {
		name := fmt.Sprintf("check-%02d-", i)
		c[i] = HealthCheckV1{Name: name + strings.Repeat("n", MaxCheckName-len(name)), Status: status,
			Message: strings.Repeat("m", MaxCheckMessage)}
	}
	return c
}

func badEncodings() []badEncoding {
	return []badEncoding{
		{"summary status", &HealthSummaryV1{Status: numHealthStatuses}, postcard.ErrBadEnum},
		{"check status", &HealthSummaryV1{Status: Unhealthy, Checks: []HealthCheckV1{{Name: "a", Status: 3}}}, postcard.ErrBadEnum},
		{"too many checks", &HealthSummaryV1{Status: Healthy, Checks: checks(MaxChecks+1, Healthy)}, postcard.ErrLengthOverBound},
		{"check name", &HealthSummaryV1{Checks: []HealthCheckV1{{Name: strings.Repeat("n", MaxCheckName+1)}}}, postcard.ErrLengthOverBound},
		{"check message", &HealthSummaryV1{Checks: []HealthCheckV1{{Name: "a", Message: strings.Repeat("m", MaxCheckMessage+1)}}}, postcard.ErrLengthOverBound},
		{"probe kind", &ProbeRequestV1{Probe: numProbeKinds}, postcard.ErrBadEnum},
		{"response probe kind", &ProbeResponseV1{Probe: 9}, postcard.ErrBadEnum},
		{"response summary", &ProbeResponseV1{Summary: HealthSummaryV1{Checks: checks(MaxChecks+1, Healthy)}}, postcard.ErrLengthOverBound},
	}
}

func invalidMessages() []invalidMessage {
	return []invalidMessage{
		{"summary status", &HealthSummaryV1{Status: 3}},
		{"empty check name", &HealthSummaryV1{Checks: []HealthCheckV1{{Status: Healthy}}}},
		{"check status", &HealthSummaryV1{Status: Unhealthy, Checks: []HealthCheckV1{{Name: "a", Status: 5}}}},
		{"summary better than check", &HealthSummaryV1{Status: Healthy, Checks: []HealthCheckV1{{Name: "a", Status: Degraded}}}},
		{"duplicate check", &HealthSummaryV1{Checks: []HealthCheckV1{{Name: "a"}, {Name: "a"}}}},
		{"too many checks", &HealthSummaryV1{Status: Unhealthy, Checks: checks(MaxChecks+1, Healthy)}},
		{"probe kind", &ProbeRequestV1{Probe: 4}},
		{"response probe kind", &ProbeResponseV1{Probe: 4}},
		{"response summary", &ProbeResponseV1{Probe: ProbeDisk, Summary: HealthSummaryV1{Status: 7}}},
	}
}

func maximalMessages() []wire.Message {
	return []wire.Message{
		&HealthSummaryV1{Status: Unhealthy, Checks: checks(MaxChecks, Unhealthy), UptimeMs: math.MaxUint64},
		&ProbeRequestV1{Probe: ProbeFull},
		&ProbeResponseV1{Probe: ProbeFull, Summary: HealthSummaryV1{Status: Unhealthy, Checks: checks(MaxChecks, Degraded),
			UptimeMs: math.MaxUint64}, DurationMs: math.MaxUint32},
	}
}

func TestEnumStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{Healthy.String(), "Healthy"}, {Degraded.String(), "Degraded"}, {Unhealthy.String(), "Unhealthy"},
		{HealthStatus(3).String(), "HealthStatus(3)"},
		{ProbeConnectivity.String(), "Connectivity"}, {ProbeDisk.String(), "Disk"},
		{ProbeClock.String(), "Clock"}, {ProbeFull.String(), "Full"}, {ProbeKind(4).String(), "ProbeKind(4)"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestBadUTF8Rejected(t *testing.T) {
	m := &HealthSummaryV1{Checks: []HealthCheckV1{{Name: "a\xff"}}}
	if _, err := decodeBody(t, MsgHealthSummary, m.AppendPostcard(nil)); !errors.Is(err, postcard.ErrBadUTF8) {
		t.Fatalf("got %v, want ErrBadUTF8", err)
	}
	if err := m.Validate(); !errors.Is(err, postcard.ErrInvalidValue) {
		t.Fatalf("Validate: got %v", err)
	}
}
