package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/wire"
)

func TestLoadDaemonExample(t *testing.T) {
	d, err := LoadDaemon("testdata/daemon.toml")
	if err != nil {
		t.Fatal(err)
	}
	if d.ID != "daemon-1" || d.Listen.QUIC != "0.0.0.0:7443" || d.Listen.Yamux != "0.0.0.0:7444" || d.Listen.WebTransport != "" {
		t.Errorf("listen/id = %+v %q", d.Listen, d.ID)
	}
	if got := d.Protocol(); got != (wire.ProtocolRange{Min: wire.V(1, 0), Max: wire.V(1, 0)}) {
		t.Errorf("protocol = %v", got)
	}
	if d.Timing.MaxBackoff.Duration != time.Minute || d.Timing.LeaseTTL.Duration != 90*time.Second {
		t.Errorf("timing = %+v", d.Timing)
	}
	want := []string{"quic://daemon-2.example.internal:7443", "yamux://daemon-2.example.internal:7444"}
	if got := d.Alternates(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("alternates = %v, want %v", got, want)
	}
	if d.Log.Format != "json" || d.Authority.SQLite == "" {
		t.Errorf("log/authority = %+v %+v", d.Log, d.Authority)
	}
}

func TestDaemonDefaults(t *testing.T) {
	d, err := ParseDaemon("min.toml", []byte(`
[tls]
certificate = "s.pem"
private_key = "k.pem"
client_ca = "ca.pem"
[authority]
postgres_dsn_file = "/run/secrets/pg.dsn"
`))
	if err != nil {
		t.Fatal(err)
	}
	if d.Listen.QUIC != DefaultDaemonListen {
		t.Errorf("listen.quic = %q", d.Listen.QUIC)
	}
	if d.Protocol() != wire.Supported {
		t.Errorf("protocol = %v, want %v", d.Protocol(), wire.Supported)
	}
	tm := d.Timing
	if tm.HeartbeatInterval.Duration != DefaultHeartbeatInterval || tm.RenewInterval.Duration != DefaultRenewInterval ||
		tm.LeaseTTL.Duration != DefaultLeaseTTL || tm.RevokeGrace.Duration != DefaultRevokeGrace || tm.MaxBackoff.Duration != DefaultMaxBackoff {
		t.Errorf("timing defaults = %+v", tm)
	}
}

const goodDaemonTLS = `
[tls]
certificate = "s.pem"
private_key = "k.pem"
client_ca = "ca.pem"
`

func TestDaemonBad(t *testing.T) {
	sqlite := "\n[authority]\nsqlite = \"a.db\"\n"
	cases := []struct {
		name, toml, key, msg string
	}{
		{"inline key", `
[tls]
certificate = "s.pem"
private_key = """-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg
-----END PRIVATE KEY-----"""
client_ca = "ca.pem"` + sqlite, "tls.private_key", "inline PEM"},
		{"secret ref", strings.Replace(goodDaemonTLS, `"s.pem"`, `"Secret(transport/server-cert)"`, 1) + sqlite, "tls.certificate", "secret-store"},
		{"missing ca", "[tls]\ncertificate = \"s.pem\"\nprivate_key = \"k.pem\"\n" + sqlite, "tls.client_ca", "required"},
		{"no authority", goodDaemonTLS, "authority", "exactly one"},
		{"both authorities", goodDaemonTLS + "[authority]\nsqlite = \"a.db\"\npostgres_dsn_file = \"x\"\n", "authority", "mutually exclusive"},
		{"inline dsn", goodDaemonTLS + "[authority]\npostgres_dsn_file = \"postgres://u:pw@h/db\"\n", "authority.postgres_dsn_file", "inline DSN"},
		{"unknown key", goodDaemonTLS + sqlite + "[timing]\nlease_tll = \"5s\"\n", "timing.lease_tll", "unknown key"},
		{"bad duration", goodDaemonTLS + sqlite + "[timing]\nlease_ttl = \"five\"\n", "timing.lease_ttl", "not a duration"},
		{"wrong type", "id = 5\n" + goodDaemonTLS + sqlite, "id", "incompatible types"},
		{"renew >= ttl", goodDaemonTLS + sqlite + "[timing]\nrenew_interval = \"2m\"\nlease_ttl = \"1m\"\n", "timing.renew_interval", "shorter than timing.lease_ttl"},
		{"grace > ttl", goodDaemonTLS + sqlite + "[timing]\nrevoke_grace = \"2h\"\n", "timing.revoke_grace", "must not exceed"},
		{"min > max", "protocol_min = \"1.5\"\nprotocol_max = \"1.0\"\n" + goodDaemonTLS + sqlite, "protocol_min", "above protocol_max"},
		{"bad version", "protocol_min = \"one\"\n" + goodDaemonTLS + sqlite, "protocol_min", "MAJOR.MINOR"},
		{"unsupported range", "protocol_min = \"7.0\"\nprotocol_max = \"9.0\"\n" + goodDaemonTLS + sqlite, "protocol_max", "does not overlap"},
		{"bad listen", goodDaemonTLS + sqlite + "[listen]\nquic = \"7443\"\n", "listen.quic", "host:port"},
		{"bad alternate", "alternate_endpoints = [\"ftp://x\"]\n" + goodDaemonTLS + sqlite, "alternate_endpoints[0]", "unknown scheme"},
		{"too many alternates", "alternate_endpoints = [" + strings.Repeat("\"quic://h\",", 17) + "]\n" + goodDaemonTLS + sqlite, "alternate_endpoints", "at most 16"},
		{"bad log level", goodDaemonTLS + sqlite + "[log]\nlevel = \"loud\"\n", "log.level", "unknown level"},
		{"syntax", "id = \n", "", "line 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseDaemon("d.toml", []byte(c.toml))
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not unwrap to ErrInvalid", err)
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %T is not *Error", err)
			}
			if ce.File != "d.toml" {
				t.Errorf("file = %q", ce.File)
			}
			if c.key != "" && ce.Key != c.key {
				t.Errorf("key = %q, want %q (%v)", ce.Key, c.key, err)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Errorf("error %q lacks %q", err, c.msg)
			}
			if strings.Contains(err.Error(), "MIGHAgEA") {
				t.Errorf("error echoes key material: %v", err)
			}
		})
	}
}

func TestLoadAgentExample(t *testing.T) {
	a, err := LoadAgent("testdata/agent.toml")
	if err != nil {
		t.Fatal(err)
	}
	eps := a.Endpoints()
	want := []Endpoint{
		{Backend: BackendQUIC, HostPort: "forgeyard.example.internal:7443"},
		{Backend: BackendYamux, HostPort: "forgeyard.example.internal:7444"},
		{Backend: BackendWebTransport, HostPort: "forgeyard.example.internal:443"},
		{Backend: BackendYamux, HostPort: "relay.example.internal:443", Relay: true},
	}
	if len(eps) != len(want) {
		t.Fatalf("endpoints = %v", eps)
	}
	for i := range want {
		if eps[i] != want[i] {
			t.Errorf("endpoint %d = %v, want %v", i, eps[i], want[i])
		}
	}
	caps := a.RunnerCapabilities()
	if caps.MaxParallel != 2 || caps.OS != "linux" || len(caps.Labels) != 2 {
		t.Errorf("caps = %+v", caps)
	}
	if a.Backoff.Max.Duration != 30*time.Second || a.Backoff.Base.Duration != 500*time.Millisecond {
		t.Errorf("backoff = %+v", a.Backoff)
	}
}

const goodAgentCred = `
[control_plane.credential]
certificate = "a.pem"
private_key = "a-key.pem"
ca = "ca.pem"
`

func TestAgentDefaults(t *testing.T) {
	a, err := ParseAgent("a.toml", []byte("[control_plane]\nendpoints = [\"127.0.0.1\"]\n"+goodAgentCred))
	if err != nil {
		t.Fatal(err)
	}
	if a.MaxParallel != DefaultMaxParallel || a.Backoff.Base.Duration != DefaultBackoffBase || a.Backoff.Max.Duration != DefaultBackoffMax {
		t.Errorf("defaults = %d %+v", a.MaxParallel, a.Backoff)
	}
	if a.Capabilities.OS == "" || a.Capabilities.Arch == "" {
		t.Error("os/arch not defaulted")
	}
	if e := a.Endpoints(); len(e) != 1 || e[0].String() != "quic://127.0.0.1:7443" {
		t.Errorf("bare endpoint = %v", e)
	}
	a, err = ParseAgent("a.toml", []byte("[control_plane]\nendpoints = [\"yamux+upgrade://h\", \"relay://r\"]\nproxy = \"http://u:p@proxy:3128\"\nno_proxy = \".internal\"\n"+
		goodAgentCred+"[fallback]\nclass_stagger = [\"100ms\", \"1s\"]\nendpoint_stagger = [\"500ms\"]\nprobe_successes = 4\ndisable_memory = true\n"))
	if err != nil {
		t.Fatal(err)
	}
	if e := a.Endpoints(); len(e) != 2 || !e[0].Upgrade || !e[1].Relay || a.ControlPlane.Proxy != "http://u:p@proxy:3128" ||
		a.Fallback.ProbeSuccesses != 4 || !a.Fallback.DisableMemory || len(a.Fallback.ClassStagger) != 2 ||
		len(a.Fallback.EndpointStagger) != 1 || a.Fallback.EndpointStagger[0].Duration != 500*time.Millisecond {
		t.Errorf("proxy/fallback config = %+v %+v %v", a.ControlPlane, a.Fallback, e)
	}
}

func TestAgentBad(t *testing.T) {
	ep := "[control_plane]\nendpoints = [\"quic://h\"]\n"
	cases := []struct{ name, toml, key, msg string }{
		{"no endpoints", goodAgentCred, "control_plane.endpoints", "required"},
		{"bad scheme", "[control_plane]\nendpoints = [\"quic://h\", \"gopher://h\"]\n" + goodAgentCred, "control_plane.endpoints[1]", "unknown scheme"},
		{"inline cert", ep + strings.Replace(goodAgentCred, `"a.pem"`, `"-----BEGIN CERTIFICATE-----"`, 1), "control_plane.credential.certificate", "inline PEM"},
		{"missing key", ep + "[control_plane.credential]\ncertificate = \"a.pem\"\nca = \"ca.pem\"\n", "control_plane.credential.private_key", "required"},
		{"parallel", "max_parallel = 70000\n" + ep + goodAgentCred, "max_parallel", "1–65535"},
		{"backoff", ep + goodAgentCred + "[backoff]\nbase = \"2m\"\nmax = \"1m\"\n", "backoff.base", "exceeds"},
		{"labels", ep + goodAgentCred + "[capabilities]\nlabels = [\"x\", \"x\"]\n", "capabilities", ""},
		{"unknown", ep + goodAgentCred + "[capabilities]\nlabel = [\"x\"]\n", "capabilities.label", "unknown key"},
		{"proxy scheme", ep + "proxy = \"socks5://p:1080\"\n" + goodAgentCred, "control_plane.proxy", "not supported"},
		{"proxy password not echoed", ep + "proxy = \"http://u:hunter2@p:3128/x\"\n" + goodAgentCred, "control_plane.proxy", "unexpected path"},
		{"no_proxy without proxy", ep + "no_proxy = \"x\"\n" + goodAgentCred, "control_plane.no_proxy", "needs control_plane.proxy"},
		{"stagger", ep + goodAgentCred + "[fallback]\nclass_stagger = [\"2m\"]\n", "fallback.class_stagger[0]", "0–1m"},
		{"endpoint stagger", ep + goodAgentCred + "[fallback]\nendpoint_stagger = [\"500ms\", \"90s\"]\n", "fallback.endpoint_stagger[1]", "0–1m"},
		{"probe interval", ep + goodAgentCred + "[fallback]\nprobe_interval = \"1ms\"\n", "fallback.probe_interval", "below 100ms"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseAgent("a.toml", []byte(c.toml))
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v, want *Error", err)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error echoes the proxy password: %v", err)
			}
			if ce.Key != c.key || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("err = %v (key %q), want key %q containing %q", err, ce.Key, c.key, c.msg)
			}
		})
	}
}

func TestParseEndpoint(t *testing.T) {
	good := map[string]string{
		"quic://h":                              "quic://h:7443",
		"QUIC://H.Example:9000":                 "quic://h.example:9000",
		"h:1":                                   "quic://h:1",
		"forgeyard://h":                         "quic://h:7443",
		"yamux://h":                             "yamux://h:7444",
		"tls+yamux://h:443":                     "yamux://h:443",
		"tls://h":                               "yamux://h:7444",
		"wt://h":                                "webtransport://h:443",
		"https://h/.well-known/forgeyard/agent": "webtransport://h:443",
		"quic://[::1]:7443":                     "quic://[::1]:7443",
		"quic://h/":                             "quic://h:7443",
		"yamux+upgrade://h":                     "yamux+upgrade://h:443",
		"YAMUX+UPGRADE://h:8443":                "yamux+upgrade://h:8443",
		"relay://r":                             "relay+yamux://r:443",
		"relay+yamux://r:1":                     "relay+yamux://r:1",
		"relay+yamux+upgrade://r":               "relay+yamux+upgrade://r:443",
		"relay+webtransport://r":                "relay+webtransport://r:443",
		"relay+quic://r":                        "relay+quic://r:7443",
	}
	for in, want := range good {
		e, err := ParseEndpoint(in)
		if err != nil || e.String() != want {
			t.Errorf("ParseEndpoint(%q) = %v, %v; want %s", in, e, err, want)
		}
	}
	if e, _ := ParseEndpoint("quic://[::1]:1"); e.Host() != "::1" {
		t.Errorf("Host = %q", e.Host())
	}
	for _, in := range []string{"", "ftp://h", "quic://", "quic://h:0", "quic://h:70000", "quic://u@h", "quic://h?x=1", "quic://h/path", "https://h/other", "quic://h:x", "yamux+upgrade://h/x", "relay+ftp://r", "http://h"} {
		if e, err := ParseEndpoint(in); err == nil {
			t.Errorf("ParseEndpoint(%q) = %v, want error", in, e)
		}
	}
}

func TestLoadFileErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadDaemon(filepath.Join(dir, "missing.toml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	if _, err := LoadAgent(dir); !errors.Is(err, ErrInvalid) {
		t.Errorf("directory: %v", err)
	}
	big := filepath.Join(dir, "big.toml")
	if err := os.WriteFile(big, make([]byte, MaxFileSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadAgent(big); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "limit") {
		t.Errorf("big file: %v", err)
	}
}

func TestLogging(t *testing.T) {
	var b strings.Builder
	Logging{Level: "warn", Format: "json"}.NewLogger(&b).Info("hidden")
	Logging{Level: "warn", Format: "json"}.NewLogger(&b).Warn("shown")
	if s := b.String(); strings.Contains(s, "hidden") || !strings.HasPrefix(s, "{") || !strings.Contains(s, "shown") {
		t.Errorf("json warn logger wrote %q", s)
	}
	if (Logging{Format: "xml"}).Validate() == nil {
		t.Error("xml format accepted")
	}
}

// TestDocsExamples parses the TOML examples of docs/operations.md ("Daemon
// and agent configuration") so the documentation cannot drift from the code.
func TestDocsExamples(t *testing.T) {
	b, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "## Daemon and agent configuration")
	if !ok {
		t.Fatal("docs/operations.md lacks the configuration section")
	}
	sec, _, _ = strings.Cut(sec, "\n## ") // this section only
	var blocks []string
	for {
		before, rest, ok := strings.Cut(sec, "```toml\n")
		if !ok {
			break
		}
		block, after, _ := strings.Cut(rest, "```")
		sec = after
		// The verbatim quotes of docs/examples/*.toml are checked by
		// TestExamplesCompleteAndDefault and TestExamplesQuotedInDocs.
		if !strings.HasSuffix(before, "by TestExamplesQuotedInDocs -->\n") {
			blocks = append(blocks, block)
		}
	}
	if len(blocks) != 2 {
		t.Fatalf("found %d toml blocks, want daemon and agent", len(blocks))
	}
	d, err := ParseDaemon("operations.md daemon", []byte(blocks[0]))
	if err != nil {
		t.Fatal(err)
	}
	if d.Listen.WebTransport == "" || d.Authority.SQLite == "" || d.Timing.LeaseTTL.Duration != DefaultLeaseTTL {
		t.Errorf("daemon example parsed as %+v", d)
	}
	a, err := ParseAgent("operations.md agent", []byte(blocks[1]))
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Endpoints()) != 3 || a.MaxParallel != 2 {
		t.Errorf("agent example parsed as %+v", a)
	}
}
