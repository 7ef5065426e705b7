package config

import (
	"strings"
	"testing"
	"time"
)

const dataBase = `
[tls]
certificate = "s.pem"
private_key = "k.pem"
client_ca = "ca.pem"
[authority]
sqlite = "a.db"
`

// TestDataAndAdmission: the [data], [admission] and [limits] sections
// parse into their fields, and unknown keys are refused naming the key.
func TestDataAndAdmission(t *testing.T) {
	d, err := ParseDaemon("d.toml", []byte(dataBase+`
[data]
log_dir = "/var/lib/fy/logs"
cas_dir = "/var/lib/fy/cas"
log_rate_bytes = 1048576
log_burst_bytes = 262144
max_attempt_log_bytes = -1
cas_max_concurrent = 32
cas_max_per_conn = 8
[admission]
max_handshakes = 64
registration_rate = 50
registration_burst = 100
max_conns_per_ip = 20
[limits]
max_streams = 128
heartbeat_rate = 5
heartbeat_burst = 10
certificate_rate_per_min = 2
max_rate_strikes = 64
`))
	if err != nil {
		t.Fatal(err)
	}
	want := Data{LogDir: "/var/lib/fy/logs", CASDir: "/var/lib/fy/cas", LogRateBytes: 1 << 20, LogBurstBytes: 256 << 10,
		MaxAttemptLogBytes: -1, CASMaxConcurrent: 32, CASMaxPerConn: 8}
	if d.Data != want {
		t.Errorf("data = %+v, want %+v", d.Data, want)
	}
	if a := (Admission{MaxHandshakes: 64, RegistrationRate: 50, RegistrationBurst: 100, MaxConnsPerIP: 20}); d.Admission != a {
		t.Errorf("admission = %+v, want %+v", d.Admission, a)
	}
	if l := (ConnLimits{MaxStreams: 128, HeartbeatRate: 5, HeartbeatBurst: 10, CertificateRatePerMin: 2, MaxRateStrikes: 64}); d.Limits != l {
		t.Errorf("limits = %+v, want %+v", d.Limits, l)
	}
	// Out-of-range limit values are refused by daemonsetup.Limits with the
	// daemon's rules (internal/setup/daemonsetup TestLimitErrors); unknown
	// keys here.
	for _, c := range []struct{ toml, key string }{
		{"[data]\nlog_dirr = \"x\"", "log_dirr"},
		{"[limits]\ncontrol_rates = 5", "control_rates"},
	} {
		_, err := ParseDaemon("d.toml", []byte(dataBase+c.toml))
		if err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("%q: error %v, want one naming %s", c.toml, err, c.key)
		}
	}
}

// TestTLSReloadInterval: tls.reload_interval parses as a duration and a
// negative one is refused naming the key.
func TestTLSReloadInterval(t *testing.T) {
	with := func(v string) string {
		return strings.Replace(dataBase, `client_ca = "ca.pem"`, `client_ca = "ca.pem"`+"\nreload_interval = "+v, 1)
	}
	d, err := ParseDaemon("d.toml", []byte(with(`"30s"`)))
	if err != nil || d.TLS.ReloadInterval.Duration != 30*time.Second {
		t.Fatalf("reload_interval 30s: %+v, %v", d, err)
	}
	if _, err := ParseDaemon("d.toml", []byte(with(`"-1s"`))); err == nil || !strings.Contains(err.Error(), "tls.reload_interval") {
		t.Fatalf("negative reload_interval: %v", err)
	}
}

// TestDataS3AndRetention: store = "s3" with [data.s3] and [data.retention]
// parse, and every missing or invalid value is refused naming its key.
func TestDataS3AndRetention(t *testing.T) {
	const s3 = `
[data]
store = "s3"
[data.s3]
endpoint = "127.0.0.1:9000"
bucket = "fy"
region = "us-east-1"
prefix = "prod/"
access_key_id = "id"
secret_access_key_file = "/etc/fy/s3-secret"
insecure = true
path_style = true
timeout = "5s"
[data.retention]
max_age = "720h"
max_bytes = 1000000
interval = "1m"
partial_max_age = "2h"
`
	d, err := ParseDaemon("d.toml", []byte(dataBase+s3))
	if err != nil {
		t.Fatal(err)
	}
	want := S3{Endpoint: "127.0.0.1:9000", Bucket: "fy", Region: "us-east-1", Prefix: "prod/", AccessKeyID: "id",
		SecretAccessKeyFile: "/etc/fy/s3-secret", Insecure: true, PathStyle: true, Timeout: Duration{5 * time.Second}}
	if d.Data.Store != StoreS3 || d.Data.S3 != want {
		t.Errorf("data.s3 = %+v, want %+v", d.Data.S3, want)
	}
	if r := (Retention{MaxAge: Duration{720 * time.Hour}, MaxBytes: 1e6, Interval: Duration{time.Minute}, PartialMaxAge: Duration{2 * time.Hour}}); d.Data.Retention != r {
		t.Errorf("data.retention = %+v, want %+v", d.Data.Retention, r)
	}
	for _, c := range []struct{ old, new, key string }{
		{`store = "s3"`, `store = "nfs"`, "data.store"},
		{`endpoint = "127.0.0.1:9000"`, `endpoint = "http://127.0.0.1:9000"`, "data.s3.endpoint"},
		{`endpoint = "127.0.0.1:9000"`, ``, "data.s3.endpoint"},
		{`bucket = "fy"`, ``, "data.s3.bucket"},
		{`access_key_id = "id"`, ``, "data.s3.access_key_id"},
		{`secret_access_key_file = "/etc/fy/s3-secret"`, `secret_access_key = "x"`, "secret_access_key"},
		{`secret_access_key_file = "/etc/fy/s3-secret"`, ``, "data.s3.secret_access_key_file"},
		{`store = "s3"`, "store = \"s3\"\nlog_dir = \"/x\"", "data.log_dir"},
		{`max_age = "720h"`, `max_age = "-1h"`, "data.retention.max_age"},
		{`max_bytes = 1000000`, `max_bytes = -1`, "data.retention.max_bytes"},
		{`interval = "1m"`, `interval = "-1m"`, "data.retention.interval"},
		{`partial_max_age = "2h"`, `partial_max_age = "-2h"`, "data.retention.partial_max_age"},
	} {
		_, err := ParseDaemon("d.toml", []byte(dataBase+strings.Replace(s3, c.old, c.new, 1)))
		if err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("%q → %q: error %v, want one naming %s", c.old, c.new, err, c.key)
		}
	}
}

// TestSessionTicketKeys: tls.session_ticket_rotation defaults to 24h, out
// of range values are refused naming the key, and disable_session_tickets
// parses; the relay refuses the rotation key (it has no authority).
func TestSessionTicketKeys(t *testing.T) {
	with := func(extra string) string {
		return strings.Replace(dataBase, `client_ca = "ca.pem"`, `client_ca = "ca.pem"`+"\n"+extra, 1)
	}
	d, err := ParseDaemon("d.toml", []byte(dataBase))
	if err != nil || d.TLS.SessionTicketRotation.Duration != DefaultSessionTicketRotation || d.TLS.DisableSessionTickets {
		t.Fatalf("defaults: %+v, %v", d.TLS, err)
	}
	d, err = ParseDaemon("d.toml", []byte(with("session_ticket_rotation = \"6h\"\ndisable_session_tickets = true")))
	if err != nil || d.TLS.SessionTicketRotation.Duration != 6*time.Hour || !d.TLS.DisableSessionTickets {
		t.Fatalf("6h, disabled: %+v, %v", d.TLS, err)
	}
	for _, v := range []string{`"30s"`, `"169h"`, `"-1h"`} {
		if _, err := ParseDaemon("d.toml", []byte(with("session_ticket_rotation = "+v))); err == nil || !strings.Contains(err.Error(), "tls.session_ticket_rotation") {
			t.Errorf("session_ticket_rotation = %s: %v, want an error naming the key", v, err)
		}
	}
	r := &Relay{TLS: ServerTLS{Certificate: "c", PrivateKey: "k", ClientCA: "ca", SessionTicketRotation: Duration{time.Hour}}, Upstream: RelayUpstream{Endpoints: []string{"d:7443"}}}
	r.ApplyDefaults()
	if err := r.Validate(); err == nil || !strings.Contains(err.Error(), "tls.session_ticket_rotation") {
		t.Errorf("relay with session_ticket_rotation: %v, want an error naming the key", err)
	}
}
