//lint:file-ignore SA1019 the test is of the deprecated limit fields

package daemon_test

import (
	"context"
	"errors"
	"testing"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
)

// TestDeprecatedLimitFields: a Config written before Bounds (its Limits,
// Admission and Data fields) means what it meant: AllLimits takes each part
// from the deprecated field while that part of Bounds is zero, a part set
// in Bounds wins, New validates the merged limits, and SetLimits leaves
// Bounds the one copy.
func TestDeprecatedLimitFields(t *testing.T) {
	var old daemon.Config
	old.Limits.MaxStreams = 9
	old.Admission.MaxHandshakes = 7
	old.Data.CASMaxPerConn = 5
	old.Bounds.Admission = daemon.Admission{MaxHandshakes: 70}
	got := old.AllLimits()
	if got.Conn.MaxStreams != 9 || got.Data.CASMaxPerConn != 5 {
		t.Errorf("AllLimits %+v: want the deprecated Limits and Data where Bounds is zero", got)
	}
	if got.Admission.MaxHandshakes != 70 {
		t.Errorf("AllLimits Admission %+v: want Bounds.Admission (set) over the deprecated field", got.Admission)
	}
	old.SetLimits(got)
	if old.Limits != (semantics.Limits{}) || old.Admission != (daemon.Admission{}) || old.AllLimits() != got {
		t.Errorf("after SetLimits: deprecated fields %+v %+v, AllLimits %+v; want them cleared and Bounds = %+v", old.Limits, old.Admission, old.AllLimits(), got)
	}
	auth, err := authority.OpenSQLite(context.Background(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer auth.Close()
	bad := daemon.Config{Authority: auth}
	bad.Data.LogRateBytes = -1
	var le *semantics.InvalidLimitError
	if _, err := daemon.New(bad); !errors.As(err, &le) || le.Field != "Data.LogRateBytes" {
		t.Fatalf("New with a bad deprecated Data field: %v, want an InvalidLimitError of Data.LogRateBytes", err)
	}
}
