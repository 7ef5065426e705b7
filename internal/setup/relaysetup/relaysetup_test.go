package relaysetup

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"

	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/relay"
)

// TestAgentYamuxConfig: the agent-facing TLS+yamux listener gets
// limits.stream_window as its per-stream window: by default the relay's
// bounded 2 MiB (relay.DefaultAgentStreamWindow), not the backend's
// 16 MiB default, and an operator's value as configured; the result is a
// valid backend Config.
func TestAgentYamuxConfig(t *testing.T) {
	var r config.Relay
	r.ApplyDefaults()
	c := AgentYamuxConfig(&r, nil)
	if c.MaxStreamWindow != relay.DefaultAgentStreamWindow {
		t.Errorf("default MaxStreamWindow = %d, want relay.DefaultAgentStreamWindow %d", c.MaxStreamWindow, relay.DefaultAgentStreamWindow)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("default: %v", err)
	}
	r.Limits.StreamWindow = 8 << 20
	if c := AgentYamuxConfig(&r, nil); c.MaxStreamWindow != 8<<20 {
		t.Errorf("limits.stream_window = 8 MiB: MaxStreamWindow = %d", c.MaxStreamWindow)
	}
}

// TestDevRelayKeyOwnerOnly: the dev relay's client key is written 0600 and
// loads as a pair with its certificate, also when a stale key file with a
// wider mode is in the way (os.WriteFile kept an existing file's mode).
func TestDevRelayKeyOwnerOnly(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, DevRelayKeyFile), []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	var r config.Relay
	if _, err := DevRelay(dir, &r); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(r.Upstream.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	if m := st.Mode().Perm(); m != 0o600 {
		t.Errorf("%s mode %o, want 600", r.Upstream.PrivateKey, m)
	}
	if _, err := tls.LoadX509KeyPair(r.Upstream.Certificate, r.Upstream.PrivateKey); err != nil {
		t.Errorf("dev relay pair: %v", err)
	}
}
