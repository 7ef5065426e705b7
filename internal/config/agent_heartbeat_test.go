package config

import (
	"strings"
	"testing"
)

// TestAgentHeartbeatMisses: heartbeat_misses is optional (0 keeps the
// agent's default 3), -1 turns the rule off, 1–1000 is a bound, anything
// else is refused naming the key.
func TestAgentHeartbeatMisses(t *testing.T) {
	base := `[control_plane]
endpoints = ["quic://d.example:7443"]
[control_plane.credential]
certificate = "/etc/forgeyard/agent.pem"
private_key = "/etc/forgeyard/agent-key.pem"
ca = "/etc/forgeyard/ca.pem"
`
	for _, c := range []struct {
		line string
		want int
		bad  bool
	}{{"", 0, false}, {"heartbeat_misses = 5", 5, false}, {"heartbeat_misses = -1", -1, false},
		{"heartbeat_misses = -2", 0, true}, {"heartbeat_misses = 1001", 0, true}} {
		a, err := ParseAgent("agent.toml", []byte(c.line+"\n"+base))
		if c.bad {
			if err == nil || !strings.Contains(err.Error(), "heartbeat_misses") {
				t.Errorf("%q: err %v, want one naming heartbeat_misses", c.line, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", c.line, err)
		}
		if a.HeartbeatMisses != c.want {
			t.Errorf("%q: HeartbeatMisses %d, want %d", c.line, a.HeartbeatMisses, c.want)
		}
	}
}
