package daemon_test

import (
	"testing"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/logs"
)

// TestDefaultLimits: the zero Limits fill to the defaults the Limits doc
// lists, and Validate refuses a negative field of each part.
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
	for name, l := range map[string]daemon.Limits{
		"conn":      {Conn: semantics.Limits{MaxStreams: -1}},
		"admission": {Admission: daemon.Admission{MaxConnsPerIP: -1}},
		"rate":      {Admission: daemon.Admission{RegistrationRate: semantics.Rate{PerSecond: -1}}},
		"data":      {Data: daemon.DataLimits{CASMaxPerConn: -1}},
		"log rate":  {Data: daemon.DataLimits{LogRateBytes: -1}},
	} {
		if err := l.Validate(); err == nil {
			t.Errorf("%s: a negative limit validated", name)
		}
	}
}
