package telemetry

import (
	"testing"

	"forgeyard.dev/transport/internal/tablefmt"
)

// TestCellsMatchTablefmt: the health report spells its cells as the
// commands' tables do.
func TestCellsMatchTablefmt(t *testing.T) {
	for _, m := range []map[string]int{nil, {}, {"quic": 1}, {"yamux": 1, "quic": 2, "webtransport": 0}} {
		if got, want := byBackend(m), tablefmt.ByBackend(m); got != want {
			t.Errorf("byBackend(%v) = %q, tablefmt says %q", m, got, want)
		}
	}
	for _, b := range []bool{false, true} {
		if got, want := yesNo(b), tablefmt.YesNo(b); got != want {
			t.Errorf("yesNo(%v) = %q, tablefmt says %q", b, got, want)
		}
	}
	for _, s := range []string{"", "x", "-"} {
		if got, want := dash(s), tablefmt.Dash(s); got != want {
			t.Errorf("dash(%q) = %q, tablefmt says %q", s, got, want)
		}
	}
}
