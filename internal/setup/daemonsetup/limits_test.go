package daemonsetup

import (
	"testing"

	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/daemon"
)

const daemonBase = `
[tls]
certificate = "s.pem"
private_key = "k.pem"
client_ca = "ca.pem"
[authority]
sqlite = "a.db"
`

// TestDaemonLimits: [limits], [admission] and [data] convert to the
// daemon's one daemon.Limits; an empty file gives exactly the daemon's
// defaults (this package keeps no copy of them).
func TestDaemonLimits(t *testing.T) {
	d, err := config.ParseDaemon("d.toml", []byte(daemonBase+`
[data]
log_rate_bytes = 1048576
cas_max_per_conn = 8
[admission]
registration_rate = 50
[limits]
max_streams = 1000
certificate_rate_per_min = 2
`))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := Limits(d)
	if err != nil {
		t.Fatal(err)
	}
	l := lim.WithDefaults()
	if l.Conn.MaxStreams != 1000 || l.Conn.StreamCredit() != 1016 || l.Conn.IdentityRate != (semantics.Rate{PerSecond: 2.0 / 60, Burst: 4 * 2}) {
		t.Errorf("conn %+v", l.Conn)
	}
	if l.Admission.RegistrationRate != (semantics.Rate{PerSecond: 50, Burst: 100}) || l.Admission.MaxHandshakes != daemon.DefaultMaxHandshakes {
		t.Errorf("admission %+v", l.Admission)
	}
	if l.Data.LogRateBytes != 1<<20 || l.Data.CASMaxPerConn != 8 || l.Data.CASMaxConcurrent != daemon.DefaultLimits().Data.CASMaxConcurrent {
		t.Errorf("data %+v", l.Data)
	}
	e, err := config.ParseDaemon("d.toml", []byte(daemonBase))
	if err != nil {
		t.Fatal(err)
	}
	el, err := Limits(e)
	if err != nil {
		t.Fatal(err)
	}
	if got := el.WithDefaults(); got != daemon.DefaultLimits() {
		t.Errorf("empty sections: %+v, want daemon.DefaultLimits() %+v", got, daemon.DefaultLimits())
	}
}
