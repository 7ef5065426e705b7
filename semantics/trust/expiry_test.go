package trust_test

import (
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

func TestExpiresWithin(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	c := &x509.Certificate{NotAfter: now.Add(10 * 24 * time.Hour)}
	cases := []struct {
		d    time.Duration
		now  time.Time
		want bool
	}{
		{9 * 24 * time.Hour, now, false},
		{10*24*time.Hour - time.Second, now, false},
		{10 * 24 * time.Hour, now, true}, // NotAfter == now+d: no longer valid then
		{14 * 24 * time.Hour, now, true},
		{0, now, false},
		{0, c.NotAfter, true},
		{0, c.NotAfter.Add(time.Hour), true}, // already expired
	}
	for _, tc := range cases {
		if got := trust.ExpiresWithin(c, tc.d, tc.now); got != tc.want {
			t.Errorf("ExpiresWithin(d=%v, now=%v) = %v, want %v", tc.d, tc.now, got, tc.want)
		}
	}
	if !trust.ExpiresWithin(nil, time.Hour, now) {
		t.Error("nil certificate should count as expiring")
	}
}

func TestExpiryWarning(t *testing.T) {
	p := trusttest.NewPKI(t)
	runner := wire.NewRunnerId()
	leaf := p.IssueClient(t, runner, trusttest.LeafOptions{}).Leaf
	window := trust.DefaultExpiryWarningWindow

	if msg := trust.ExpiryWarning(leaf, window, leaf.NotAfter.Add(-window-time.Minute)); msg != "" {
		t.Errorf("outside window: %q", msg)
	}
	msg := trust.ExpiryWarning(leaf, window, leaf.NotAfter.Add(-(3*24*time.Hour + 4*time.Hour)))
	for _, want := range []string{runner.String(), "expires at", leaf.NotAfter.UTC().Format(time.RFC3339), "in 3d4h", "rotate"} {
		if !strings.Contains(msg, want) {
			t.Errorf("warning %q lacks %q", msg, want)
		}
	}
	msg = trust.ExpiryWarning(leaf, window, leaf.NotAfter.Add(2*time.Hour+30*time.Minute))
	for _, want := range []string{"EXPIRED", "2h30m ago", "rejects"} {
		if !strings.Contains(msg, want) {
			t.Errorf("expired warning %q lacks %q", msg, want)
		}
	}
	noRunner := p.IssueClient(t, runner, trusttest.LeafOptions{OmitRunnerURI: true, CommonName: "legacy agent"}).Leaf
	if msg := trust.ExpiryWarning(noRunner, window, noRunner.NotAfter.Add(-time.Minute)); !strings.Contains(msg, "legacy agent") || !strings.Contains(msg, "in 1m0s") {
		t.Errorf("warning without runner URI: %q", msg)
	}
	if msg := trust.ExpiryWarning(nil, window, time.Now()); msg == "" {
		t.Error("nil certificate gave no warning")
	}
}
