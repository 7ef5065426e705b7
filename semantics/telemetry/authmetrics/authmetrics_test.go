package authmetrics_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/telemetry/authmetrics"
	"forgeyard.dev/transport/wire"
)

// stub is an authority.Authority whose methods are never called.
type stub struct{ authority.Authority }

// failing answers RunnerStatus with err.
type failing struct {
	authority.Authority
	err error
}

func (f failing) RunnerStatus(context.Context, wire.RunnerId) (authority.RunnerStatus, error) {
	return authority.RunnerStatus{}, f.err
}

// TestInstrumentAuthority: a real SQLite authority wrapped records each
// call's latency and classifies errors; Identities stays reachable.
func TestInstrumentAuthority(t *testing.T) {
	ctx := context.Background()
	au, err := authority.OpenSQLite(ctx, filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer au.Close()
	m := telemetry.NewMetrics()
	ia := authmetrics.Instrument(m, au)
	if authority.IdentitiesOf(ia) == nil {
		t.Fatal("the wrapped SQLite authority lost its Identities")
	}
	if authority.IdentitiesOf(authmetrics.Instrument(m, stub{})) != nil {
		t.Error("a wrapper of an authority without Identities claims to have them")
	}
	if _, err := ia.RunnerStatus(ctx, wire.NewRunnerId()); err != nil {
		t.Fatal(err)
	}
	if _, err := ia.Lease(ctx, wire.NewLeaseId()); !errors.Is(err, authority.ErrNotFound) {
		t.Fatalf("Lease of an unknown id: %v", err)
	}
	if _, err := authority.IdentitiesOf(ia).EnrollmentTokens(ctx, 10); err != nil {
		t.Fatal(err)
	}
	fail := authmetrics.Instrument(m, failing{err: fmt.Errorf("database is locked")})
	_, _ = fail.RunnerStatus(ctx, wire.NewRunnerId())
	canceled := authmetrics.Instrument(m, failing{err: fmt.Errorf("query: %w", context.Canceled)})
	_, _ = canceled.RunnerStatus(ctx, wire.NewRunnerId())

	fams := gather(t, m)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"forgeyard_authority_errors_total", map[string]string{"operation": "lease", "kind": "refused"}, 1},
		{"forgeyard_authority_errors_total", map[string]string{"operation": "runner_status", "kind": "failed"}, 1},
		{"forgeyard_authority_errors_total", map[string]string{"operation": "runner_status", "kind": "canceled"}, 1},
		{"forgeyard_authority_errors_total", map[string]string{"operation": "register_session", "kind": "failed"}, 0},
	} {
		if got := value(t, fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	counts := map[string]uint64{}
	for _, mm := range fams["forgeyard_authority_operation_duration_seconds"].GetMetric() {
		counts[mm.GetLabel()[0].GetValue()] = mm.GetHistogram().GetSampleCount()
	}
	if counts["runner_status"] != 3 || counts["lease"] != 1 || counts["enrollment_tokens"] != 1 || counts["complete_attempt"] != 0 {
		t.Errorf("latency sample counts = %v", counts)
	}
	if len(counts) != len(authmetrics.Operations) {
		t.Errorf("%d operation series, want one per operation (%d)", len(counts), len(authmetrics.Operations))
	}
}

// TestAuthorityOperationsCoverInterfaces: every method of Authority and
// Identities (but Close) has its operation label.
func TestAuthorityOperationsCoverInterfaces(t *testing.T) {
	n := 0
	for _, typ := range []any{(*authority.Authority)(nil), (*authority.Identities)(nil)} {
		n += reflect.TypeOf(typ).Elem().NumMethod()
	}
	if got := len(authmetrics.Operations); got != n-1 { // less Close
		t.Errorf("%d operation labels for %d methods (less Close)", got, n-1)
	}
}

func gather(t *testing.T, m *telemetry.Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	fs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fs {
		out[f.GetName()] = f
	}
	return out
}

// value returns the sample of family name whose labels include want.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	for _, m := range fams[name].GetMetric() {
		ok := true
		for k, v := range want {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			ok = ok && found
		}
		if ok {
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s%v", name, want)
	return 0
}

// TestInstrumentKeepsOptionalInterfaces: the daemon finds the inventory and
// the sweep elector of the authority it runs on through the decorator (a
// lookup that stopped at the decorator would silently fall back to this
// daemon's own memory for drains and to sweeping on every daemon).
func TestInstrumentKeepsOptionalInterfaces(t *testing.T) {
	au, err := authority.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer au.Close()
	wrapped := authmetrics.Instrument(telemetry.NewMetrics(), au)
	if authority.InventoryOf(au) == nil || authority.InventoryOf(wrapped) == nil {
		t.Fatal("InventoryOf does not see through the metrics decorator")
	}
	if authority.TicketKeysOf(au) == nil || authority.TicketKeysOf(wrapped) == nil {
		t.Fatal("TicketKeysOf does not see through the metrics decorator")
	}
	if authority.SweepElectorOf(au) == nil || authority.SweepElectorOf(wrapped) == nil {
		t.Fatal("SweepElectorOf does not see through the metrics decorator")
	}
	if authority.IdentitiesOf(wrapped) == nil {
		t.Fatal("IdentitiesOf lost through the decorator")
	}
}
