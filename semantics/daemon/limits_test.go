package daemon_test

import (
	"errors"
	"testing"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/logs"
)

// TestDefaultLimits: the zero Limits fill to the defaults the Limits doc
// lists, and Validate reports a field that breaks its rule as a
// *semantics.InvalidLimitError naming its path from Limits.
func TestDefaultLimits(t *testing.T) {
	d := daemon.DefaultLimits()
	if d.Conn != semantics.DefaultLimits() {
		t.Errorf("Conn %+v, want semantics.DefaultLimits()", d.Conn)
	}
	if d.Conn.MaxStreams != 256 || d.Conn.StreamCredit() != 272 {
		t.Errorf("MaxStreams %d, credit %d, want 256 and 272", d.Conn.MaxStreams, d.Conn.StreamCredit())
	}
	if a := (daemon.Admission{MaxHandshakes: 1024, RegistrationRate: semantics.Rate{PerSecond: 2000, Burst: 4000},
		MaxConnections: 20000, FDHeadroom: 256}); d.Admission != a {
		t.Errorf("Admission %+v, want %+v", d.Admission, a)
	}
	if d.Data.MaxAttemptLogBytes != logs.DefaultMaxAttemptBytes || d.Data.MaxLogAttempts != logs.DefaultMaxAttempts ||
		d.Data.CASMaxConcurrent != cas.DefaultServerMaxConcurrent || d.Data.CASMaxPerConn != cas.DefaultServerMaxPerConn ||
		d.Data.LogRateBytes != 0 || d.Data.CASBandwidth != nil {
		t.Errorf("Data %+v", d.Data)
	}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	var cfg daemon.Config
	cfg.SetLimits(d)
	if got := cfg.AllLimits(); got != d {
		t.Errorf("SetLimits/AllLimits: %+v, want %+v", got, d)
	}
	for _, c := range []struct {
		l     daemon.Limits
		field string
		value any
	}{
		{daemon.Limits{Conn: semantics.Limits{MaxStreams: -1}}, "Conn.MaxStreams", -1},
		{daemon.Limits{Conn: semantics.Limits{HeartbeatRate: semantics.Rate{Burst: -1}}}, "Conn.HeartbeatRate.Burst", -1},
		{daemon.Limits{Admission: daemon.Admission{MaxHandshakes: -1}}, "Admission.MaxHandshakes", -1},
		{daemon.Limits{Admission: daemon.Admission{MaxConnsPerIP: -1}}, "Admission.MaxConnsPerIP", -1},
		{daemon.Limits{Admission: daemon.Admission{RegistrationRate: semantics.Rate{PerSecond: -1}}}, "Admission.RegistrationRate.PerSecond", -1.0},
		{daemon.Limits{Admission: daemon.Admission{FDHeadroom: -1}}, "Admission.FDHeadroom", -1},
		{daemon.Limits{Data: daemon.DataLimits{CASMaxPerConn: -1}}, "Data.CASMaxPerConn", -1},
		{daemon.Limits{Data: daemon.DataLimits{LogRateBytes: -1}}, "Data.LogRateBytes", -1.0},
		{daemon.Limits{Data: daemon.DataLimits{LogBurstBytes: -1}}, "Data.LogBurstBytes", int64(-1)},
		{daemon.Limits{Data: daemon.DataLimits{MaxLogAttempts: -1}}, "Data.MaxLogAttempts", -1},
	} {
		err := c.l.Validate()
		var le *semantics.InvalidLimitError
		if !errors.As(err, &le) {
			t.Errorf("%s: Validate = %v, want an *InvalidLimitError", c.field, err)
			continue
		}
		if le.Type != "daemon.Limits" || le.Field != c.field || le.Value != c.value || le.Rule == "" {
			t.Errorf("%s: %#v, want Type daemon.Limits, Field %s, Value %#v and a rule", c.field, le, c.field, c.value)
		}
	}
	// Negative is "none" for these two.
	none := daemon.Limits{Admission: daemon.Admission{MaxConnections: -1}, Data: daemon.DataLimits{MaxAttemptLogBytes: -1}}
	if err := none.Validate(); err != nil {
		t.Errorf("MaxConnections and MaxAttemptLogBytes -1 (none): %v", err)
	}
}
