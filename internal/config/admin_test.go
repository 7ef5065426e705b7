package config

import (
	"errors"
	"strings"
	"testing"
)

func TestAdminAddr(t *testing.T) {
	for _, c := range []struct {
		addr   string
		remote bool
		want   string
		err    string
	}{
		{"", false, "", ""},
		{":9464", false, "127.0.0.1:9464", ""},
		{"127.0.0.1:0", false, "127.0.0.1:0", ""},
		{"[::1]:9464", false, "[::1]:9464", ""},
		{"localhost:9464", false, "localhost:9464", ""},
		{"0.0.0.0:9464", false, "", "not a loopback address"},
		{"[::ffff:10.0.0.1]:9464", false, "", "admin.token_file"},
		{"10.1.2.3:9464", false, "", "admin.allow_remote"},
		{"metrics.example:9464", false, "", "not a loopback address"},
		{"0.0.0.0:9464", true, "0.0.0.0:9464", ""},
		{"9464", false, "", "host:port"},
		{"127.0.0.1:99999", false, "", "0–65535"},
	} {
		got, err := AdminAddr("admin.listen", c.addr, c.remote)
		if c.err != "" {
			var ce *Error
			if err == nil || !strings.Contains(err.Error(), c.err) || !errors.As(err, &ce) || !strings.Contains(err.Error(), "admin.listen") {
				t.Errorf("%q remote=%v: err %v, want *Error naming admin.listen with %q", c.addr, c.remote, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q remote=%v = %q, %v; want %q", c.addr, c.remote, got, err, c.want)
		}
	}
}

func TestDaemonAdminKeys(t *testing.T) {
	base := "[tls]\ncertificate = \"s.pem\"\nprivate_key = \"k.pem\"\nclient_ca = \"ca.pem\"\n[authority]\nsqlite = \"a.db\"\n"
	d, err := ParseDaemon("d.toml", []byte(base+"[admin]\nlisten = \":9464\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := d.AdminListen(); got != "127.0.0.1:9464" {
		t.Errorf("AdminListen = %q", got)
	}
	if _, err := ParseDaemon("d.toml", []byte(base+"[admin]\nlisten = \"0.0.0.0:9464\"\n")); err == nil || !strings.Contains(err.Error(), "d.toml: admin.listen") {
		t.Errorf("remote admin without allow_remote: %v", err)
	}
	if _, err := ParseDaemon("d.toml", []byte(base+"[admin]\nlisten = \"0.0.0.0:9464\"\nallow_remote = true\n")); err == nil || !strings.Contains(err.Error(), "admin.allow_remote: a remote admin endpoint needs admin.token_file") {
		t.Errorf("remote admin without a token: %v", err)
	}
	d, err = ParseDaemon("d.toml", []byte(base+"[admin]\nlisten = \"0.0.0.0:9464\"\nallow_remote = true\ntoken_file = \"/etc/t\"\n"))
	if err != nil || d.AdminListen() != "0.0.0.0:9464" {
		t.Errorf("allow_remote: %v %+v", err, d)
	}
	d, err = ParseDaemon("d.toml", []byte(base))
	if err != nil || d.AdminListen() != "" {
		t.Errorf("no admin: %q %v", d.AdminListen(), err)
	}
}

func TestAdminValidate(t *testing.T) {
	for _, c := range []struct {
		a    Admin
		want string // "" = valid
	}{
		{Admin{}, ""},
		{Admin{Socket: "/run/forgeyard/admin.sock"}, ""},
		{Admin{Listen: ":9464", TokenFile: "/etc/forgeyard/admin.token", PublicMetrics: true}, ""},
		{Admin{Socket: "admin.sock"}, "admin.socket: \"admin.sock\" must be an absolute path"},
		{Admin{Socket: "/" + strings.Repeat("s", 120)}, "admin.socket: path longer than 104 bytes"},
		{Admin{TokenFile: "/etc/t"}, "admin.token_file: set admin.listen too"},
		{Admin{Listen: ":1", TokenFile: "-----BEGIN X"}, "admin.token_file: holds inline PEM"},
		{Admin{Listen: "10.0.0.1:9464", AllowRemote: true}, "needs admin.token_file"},
	} {
		err := c.a.Validate()
		if c.want == "" {
			if err != nil {
				t.Errorf("%+v: %v", c.a, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.a, err, c.want)
		}
	}
}

func TestTelemetryValidate(t *testing.T) {
	for _, ok := range []string{"", "http://127.0.0.1:4318", "https://collector.example:4318", "http://[::1]:4318/prefix"} {
		if err := (Telemetry{OTLPEndpoint: ok}).Validate(); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"127.0.0.1:4318", "grpc://collector:4317", "http://", "http://u:p@collector:4318",
		"http://collector:4318/v1/traces", "http://collector:4318/?x=1", "://"} {
		err := (Telemetry{OTLPEndpoint: bad}).Validate()
		var ce *Error
		if !errors.As(err, &ce) || ce.Key != "telemetry.otlp_endpoint" {
			t.Errorf("%q: got %v, want an *Error for telemetry.otlp_endpoint", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), "u:p") {
			t.Errorf("%q: the error repeats the credentials: %v", bad, err)
		}
	}
}
