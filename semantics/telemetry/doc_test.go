package telemetry_test

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/telemetry/authmetrics"
)

// TestOperationsDocListsEveryMetric: the first table of the "## Metrics"
// section of docs/operations.md lists exactly the metrics NewMetrics
// registers, each with its type and label names, so the operator
// documentation cannot go stale.
func TestOperationsDocListsEveryMetric(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "\n## Metrics\n")
	if i < 0 {
		t.Fatal(`docs/operations.md has no "## Metrics" section`)
	}
	section := doc[i:]
	j := strings.Index(section, "| Metric | Type | Labels | Meaning |")
	if j < 0 {
		t.Fatal("the Metrics section has no metric table")
	}
	type row struct{ typ, labels string }
	documented := map[string]row{}
	for _, line := range strings.Split(section[j:], "\n")[2:] {
		if !strings.HasPrefix(line, "| `") {
			break // end of the first table
		}
		cells := strings.Split(line, "|")
		if len(cells) < 5 {
			t.Fatalf("malformed table row %q", line)
		}
		name := strings.Trim(strings.TrimSpace(cells[1]), "`")
		if _, dup := documented[name]; dup {
			t.Errorf("%s documented twice", name)
		}
		documented[name] = row{typ: strings.TrimSpace(cells[2]), labels: strings.TrimSpace(cells[3])}
	}

	m := telemetry.NewMetrics()
	m.Fallback("quic", "yamux") // vectors without pre-created series show up once used
	// The daemon's families, registered when it wraps its authority and
	// watches its certificates.
	authmetrics.Instrument(m, stubAuthority{})
	m.WatchCertificate("server", func() *x509.Certificate { return &x509.Certificate{NotAfter: time.Now()} })
	m.AuthorityUp(true) // and when its dependency prober starts
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	registered := map[string]bool{}
	for _, f := range fams {
		name := f.GetName()
		registered[name] = true
		d, ok := documented[name]
		if !ok {
			t.Errorf("%s is registered but not in the docs/operations.md Metrics table", name)
			continue
		}
		if want := strings.ToLower(f.GetType().String()); d.typ != want {
			t.Errorf("%s: documented type %q, registered %q", name, d.typ, want)
		}
		if got, want := d.labels, labelNames(f); got != want {
			t.Errorf("%s: documented labels %q, registered %q", name, got, want)
		}
	}
	for name := range documented {
		if !registered[name] {
			t.Errorf("%s is documented but not registered", name)
		}
	}
}

// labelNames renders a family's label names as the doc table does: "a, b"
// in registration order, or "–" for none.
func labelNames(f *dto.MetricFamily) string {
	if len(f.GetMetric()) == 0 {
		return "?"
	}
	var names []string
	for _, l := range f.GetMetric()[0].GetLabel() {
		names = append(names, l.GetName())
	}
	if len(names) == 0 {
		return "–"
	}
	// Gather sorts label pairs by name; the doc uses the same order.
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// stubAuthority is an authority.Authority whose methods are never called.
type stubAuthority struct{ authority.Authority }
