package telemetry_test

import (
	"crypto/x509"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/telemetry"
)

// TestCertificateExpiryGauge: the gauge follows the watched function (a
// renewed certificate shows at the next scrape); unknown roles are ignored.
func TestCertificateExpiryGauge(t *testing.T) {
	m := telemetry.NewMetrics()
	notAfter := time.Date(2027, 3, 1, 12, 0, 0, 0, time.UTC)
	cur := notAfter
	m.WatchCertificate("server", func() *x509.Certificate { return &x509.Certificate{NotAfter: cur} })
	m.WatchCertificate("runner-01M8", func() *x509.Certificate { return &x509.Certificate{NotAfter: cur} })
	fams := parse(t, scrape(t, m.Handler()))
	if got := value(t, fams, "forgeyard_certificate_expiry_timestamp_seconds", map[string]string{"certificate": "server"}); got != float64(notAfter.Unix()) {
		t.Errorf("expiry = %v, want %v", got, notAfter.Unix())
	}
	cur = notAfter.Add(30 * 24 * time.Hour)
	fams = parse(t, scrape(t, m.Handler()))
	if got := value(t, fams, "forgeyard_certificate_expiry_timestamp_seconds", map[string]string{"certificate": "server"}); got != float64(cur.Unix()) {
		t.Errorf("after renewal expiry = %v, want %v", got, cur.Unix())
	}
	if n := len(fams["forgeyard_certificate_expiry_timestamp_seconds"].GetMetric()); n != 1 {
		t.Errorf("%d series; an unknown role must not create one", n)
	}
}
