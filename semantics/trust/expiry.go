package trust

import (
	"crypto/x509"
	"fmt"
	"time"
)

// DefaultExpiryWarningWindow is how long before expiry an agent starts
// warning about its certificate (§22): two weeks, long enough for an
// operator to notice and rotate a 90-day certificate.
const DefaultExpiryWarningWindow = 14 * 24 * time.Hour

// ExpiresWithin reports whether c is no longer valid at now+d, that is
// whether c.NotAfter is before or at now+d. An already expired certificate
// therefore expires within any d >= 0. A nil c reports true (no credential
// is as good as an expired one).
func ExpiresWithin(c *x509.Certificate, d time.Duration, now time.Time) bool {
	if c == nil {
		return true
	}
	return !c.NotAfter.After(now.Add(d))
}

// ExpiryWarning returns the message an agent logs when its certificate c
// expires within window of now, and "" otherwise. The message names the
// runner (if the certificate is bound to one), the expiry time in UTC and
// the remaining time, and says what to do. It never includes key material.
func ExpiryWarning(c *x509.Certificate, window time.Duration, now time.Time) string {
	if c == nil {
		return "no agent certificate is configured; the daemon will reject this agent"
	}
	if !ExpiresWithin(c, window, now) {
		return ""
	}
	who := fmt.Sprintf("certificate %q", c.Subject.String())
	if id, err := RunnerIDFromCert(c); err == nil {
		who = "certificate for runner " + id.String()
	}
	at := c.NotAfter.UTC().Format(time.RFC3339)
	if now.After(c.NotAfter) {
		return fmt.Sprintf("agent %s EXPIRED at %s (%s ago); the daemon rejects it: rotate it now (the RunnerId is kept)",
			who, at, humanDuration(now.Sub(c.NotAfter)))
	}
	return fmt.Sprintf("agent %s expires at %s (in %s); rotate it before then (the RunnerId is kept)",
		who, at, humanDuration(c.NotAfter.Sub(now)))
}

// humanDuration renders d coarsely: days and hours, or hours and minutes,
// or minutes and seconds.
func humanDuration(d time.Duration) string {
	switch {
	case d >= 24*time.Hour:
		days := d / (24 * time.Hour)
		return fmt.Sprintf("%dd%dh", days, (d-days*24*time.Hour)/time.Hour)
	case d >= time.Hour:
		return fmt.Sprintf("%dh%dm", d/time.Hour, (d%time.Hour)/time.Minute)
	default:
		return d.Round(time.Second).String()
	}
}
