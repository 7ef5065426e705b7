package config

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

const relayTOML = `
[listen]
yamux = "127.0.0.1:7444"
webtransport = "127.0.0.1:8443"

[tls]
certificate = "/etc/forgeyard/relay-server.pem"
private_key = "/etc/forgeyard/relay-server-key.pem"
client_ca = "/etc/forgeyard/runner-ca.pem"

[upstream]
endpoints = ["quic://Daemon-1.example", "daemon-2.example:7500"]
ca = "/etc/forgeyard/daemon-ca.pem"
certificate = "/etc/forgeyard/relay-client.pem"
private_key = "/etc/forgeyard/relay-client-key.pem"
dial_timeout = "500ms"

[limits]
max_streams_per_connection = 64

[admin]
listen = ":9465"
`

func TestParseRelay(t *testing.T) {
	r, err := ParseRelay("relay.toml", []byte(relayTOML))
	if err != nil {
		t.Fatal(err)
	}
	if got := r.UpstreamAddrs(); len(got) != 2 || got[0] != "daemon-1.example:7443" || got[1] != "daemon-2.example:7500" {
		t.Fatalf("UpstreamAddrs = %v", got)
	}
	if r.Upstream.DialTimeout.Duration != 500*time.Millisecond || r.Limits.MaxStreamsPerConnection != 64 ||
		r.Limits.MaxConnections != DefaultRelayMaxConnections || r.Limits.CopyBuffer != DefaultRelayCopyBuffer ||
		r.Limits.StreamWindow != DefaultRelayStreamWindow {
		t.Fatalf("parsed %+v", r)
	}
	if r.AdminListen() != "127.0.0.1:9465" {
		t.Fatalf("AdminListen = %q", r.AdminListen())
	}
}

func TestRelayErrors(t *testing.T) {
	for _, c := range []struct{ edit, key, msg string }{
		{`endpoints = ["quic://Daemon-1.example", "daemon-2.example:7500"]|endpoints = ["yamux://d.example"]`, "upstream.endpoints[0]", "over QUIC only"},
		{`endpoints = ["quic://Daemon-1.example", "daemon-2.example:7500"]|endpoints = []`, "upstream.endpoints", "required"},
		{`client_ca = "/etc/forgeyard/runner-ca.pem"|`, "tls.client_ca", "required"},
		{`private_key = "/etc/forgeyard/relay-client-key.pem"|`, "upstream.certificate", "go together"},
		{`max_streams_per_connection = 64|copy_buffer = 12`, "limits.copy_buffer", "out of range"},
		{`max_streams_per_connection = 64|stream_window = 65536`, "limits.stream_window", "out of range"},
		{`max_streams_per_connection = 64|stream_window = 33554432`, "limits.stream_window", "out of range"},
		{`dial_timeout = "500ms"|dial_timeout = "2m"`, "upstream.dial_timeout", "maximum"},
		{`listen = ":9465"|listen = "10.0.0.1:9465"`, "admin.listen", "not a loopback"},
		{`listen = ":9465"|listen = ":9465"
token_file = "/etc/forgeyard/admin.token"`, "admin.token_file", "not used by forgeyard-relay"},
		{`listen = ":9465"|listen = ":9465"
public_metrics = true`, "admin.public_metrics", "not used by forgeyard-relay"},
		{`listen = ":9465"|listen = ":9465"
socket = "/run/forgeyard/relay.sock"`, "admin.socket", "not used by forgeyard-relay"},
		{`[limits]|[limitz]`, "limitz", "unknown key"},
		{`ca = "/etc/forgeyard/daemon-ca.pem"|ca = "-----BEGIN CERTIFICATE-----"`, "upstream.ca", "inline PEM"},
	} {
		old, repl, _ := strings.Cut(c.edit, "|")
		if !strings.Contains(relayTOML, old) {
			t.Fatalf("test bug: %q not in the sample", old)
		}
		_, err := ParseRelay("relay.toml", []byte(strings.Replace(relayTOML, old, repl, 1)))
		var ce *Error
		if !errors.As(err, &ce) || ce.Key != c.key || !strings.Contains(ce.Msg, c.msg) || ce.File != "relay.toml" {
			t.Errorf("%s: got %v, want key %s with %q", c.edit, err, c.key, c.msg)
		}
	}
}

func TestRelayDefaults(t *testing.T) {
	r := &Relay{TLS: ServerTLS{Certificate: "c", PrivateKey: "k", ClientCA: "ca"}, Upstream: RelayUpstream{Endpoints: []string{"d:7443"}}}
	r.ApplyDefaults()
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	if r.Listen.Yamux != DefaultRelayListenYamux || r.ShutdownTimeout.Duration != DefaultRelayShutdownTimeout {
		t.Fatalf("defaults %+v", r)
	}
	// Issue 18: a stock corporate proxy allows CONNECT to 443 only.
	if r.Listen.Yamux != "0.0.0.0:443" {
		t.Fatalf("default listen.yamux %q, want 0.0.0.0:443", r.Listen.Yamux)
	}
}

// TestRelayDocsExample parses the TOML example of docs/operations.md
// ("Running forgeyard-relay").
func TestRelayDocsExample(t *testing.T) {
	b, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "## Running forgeyard-relay")
	if !ok {
		t.Fatal("docs/operations.md lacks the relay section")
	}
	_, rest, ok := strings.Cut(sec, "```toml\n")
	if !ok {
		t.Fatal("no toml block in the relay section")
	}
	block, _, _ := strings.Cut(rest, "```")
	r, err := ParseRelay("operations.md relay", []byte(block))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.UpstreamAddrs()) != 2 || r.Listen.WebTransport == "" || r.Upstream.Certificate == "" || r.AdminListen() == "" {
		t.Errorf("relay example parsed as %+v", r)
	}
}
