package config

import (
	"strings"
	"testing"
	"time"
)

// TestAgentKeepAliveAndAuthBackoff: control_plane.keepalive_interval and
// disable_keepalive_adapt, backoff.auth_after and auth_max: defaults,
// values, and out-of-range values refused naming the key.
func TestAgentKeepAliveAndAuthBackoff(t *testing.T) {
	const cred = `[control_plane.credential]
certificate = "/etc/forgeyard/agent.pem"
private_key = "/etc/forgeyard/agent-key.pem"
ca = "/etc/forgeyard/ca.pem"
`
	parse := func(cp, backoff string) (*Agent, error) {
		return ParseAgent("agent.toml", []byte("[control_plane]\nendpoints = [\"relay+yamux://r.example:443\"]\n"+cp+"\n"+cred+"[backoff]\n"+backoff+"\n"))
	}
	a, err := parse("", "")
	if err != nil {
		t.Fatal(err)
	}
	if a.ControlPlane.KeepAliveInterval.Duration != 10*time.Second || a.ControlPlane.DisableKeepAliveAdapt ||
		a.Backoff.AuthAfter != 3 || a.Backoff.AuthMax.Duration != time.Hour {
		t.Fatalf("defaults: keepalive %v adapt-off %v auth_after %d auth_max %v", a.ControlPlane.KeepAliveInterval.Duration,
			a.ControlPlane.DisableKeepAliveAdapt, a.Backoff.AuthAfter, a.Backoff.AuthMax.Duration)
	}
	a, err = parse("keepalive_interval = \"4s\"\ndisable_keepalive_adapt = true", "auth_after = 5\nauth_max = \"6h\"")
	if err != nil {
		t.Fatal(err)
	}
	if a.ControlPlane.KeepAliveInterval.Duration != 4*time.Second || !a.ControlPlane.DisableKeepAliveAdapt ||
		a.Backoff.AuthAfter != 5 || a.Backoff.AuthMax.Duration != 6*time.Hour {
		t.Fatalf("values: %+v %+v", a.ControlPlane, a.Backoff)
	}
	for _, c := range []struct{ cp, backoff, key string }{
		{`keepalive_interval = "500ms"`, "", "control_plane.keepalive_interval"},
		{`keepalive_interval = "10m"`, "", "control_plane.keepalive_interval"},
		{"", "auth_after = -1", "backoff.auth_after"},
		{"", "auth_after = 101", "backoff.auth_after"},
		{"", `auth_max = "30s"`, "backoff.auth_max"},
		{"", `auth_max = "48h"`, "backoff.auth_max"},
	} {
		if _, err := parse(c.cp, c.backoff); err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("%q %q: err %v, want one naming %s", c.cp, c.backoff, err, c.key)
		}
	}
}
