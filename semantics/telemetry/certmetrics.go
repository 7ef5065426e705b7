package telemetry

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Certificate label values of forgeyard_certificate_expiry_timestamp_seconds
// (a closed set: never a subject or serial, §208).
var CertificateRoles = []string{
	"server",          // daemon or relay: the server certificate served now
	"client_ca",       // daemon or relay: the CA of agent certificates (tls.client_ca)
	"issuer",          // daemon: the enrollment CA signing runner certificates
	"client",          // agent: its runner certificate (renewed in place)
	"ca",              // agent: the CA of the daemon's certificate
	"upstream_client", // relay: its client certificate towards the daemons
	"upstream_ca",     // relay: the CA of the daemons' certificates
}

var descCertExpiry = prometheus.NewDesc(Namespace+"_certificate_expiry_timestamp_seconds",
	"NotAfter of a certificate this process uses, as a Unix time in seconds, by certificate role; time() - this is negative while valid.",
	[]string{"certificate"}, nil)

// CertificateCollector exports forgeyard_certificate_expiry_timestamp_seconds
// for the certificates given to Watch, read at every scrape (so a reloaded
// or renewed certificate shows at once). Register it on a registry, or use
// Metrics.WatchCertificate.
type CertificateCollector struct {
	mu    sync.Mutex
	roles map[string]func() *x509.Certificate
}

// NewCertificateCollector returns a collector watching no certificate yet.
func NewCertificateCollector() *CertificateCollector {
	return &CertificateCollector{roles: map[string]func() *x509.Certificate{}}
}

// Describe implements prometheus.Collector.
func (c *CertificateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descCertExpiry }

// Collect implements prometheus.Collector.
func (c *CertificateCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	roles := make([]string, 0, len(c.roles))
	for r := range c.roles {
		roles = append(roles, r)
	}
	fns := make([]func() *x509.Certificate, len(roles))
	slices.Sort(roles)
	for i, r := range roles {
		fns[i] = c.roles[r]
	}
	c.mu.Unlock()
	for i, r := range roles {
		if cert := fns[i](); cert != nil {
			ch <- prometheus.MustNewConstMetric(descCertExpiry, prometheus.GaugeValue, float64(cert.NotAfter.Unix()), r)
		}
	}
}

// Watch reports current's certificate as role (one of CertificateRoles;
// any other value is ignored, so no series is created per name); current
// is called at every scrape, nil means no sample. Watching a role again
// replaces its function.
func (c *CertificateCollector) Watch(role string, current func() *x509.Certificate) {
	if c == nil || current == nil || !slices.Contains(CertificateRoles, role) {
		return
	}
	c.mu.Lock()
	c.roles[role] = current
	c.mu.Unlock()
}

// WatchCertificate is CertificateCollector.Watch on m's registry.
func (m *Metrics) WatchCertificate(role string, current func() *x509.Certificate) {
	if m == nil {
		return
	}
	m.certOnce.Do(func() {
		m.certs = NewCertificateCollector()
		m.reg.MustRegister(m.certs)
	})
	m.certs.Watch(role, current)
}

// CertificateFile returns a function reading the PEM file at path and
// returning its certificate that expires first (the leaf of a chain, the
// first-expiring CA of a bundle); nil when the file cannot be read or holds
// no certificate. Reading at every call follows rotations and renewals
// that rewrite the file.
func CertificateFile(path string) func() *x509.Certificate {
	return func() *x509.Certificate {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		var first *x509.Certificate
		for {
			var blk *pem.Block
			blk, b = pem.Decode(b)
			if blk == nil {
				return first
			}
			if blk.Type != "CERTIFICATE" {
				continue
			}
			c, err := x509.ParseCertificate(blk.Bytes)
			if err == nil && (first == nil || c.NotAfter.Before(first.NotAfter)) {
				first = c
			}
		}
	}
}

// RegisterRuntimeCollectors adds the Go runtime (go_*) and process
// (process_*: CPU, memory, file descriptors, start time) collectors, as
// every command's /metrics serves them.
func (m *Metrics) RegisterRuntimeCollectors() {
	if m == nil {
		return
	}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}
