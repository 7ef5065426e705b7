package agentsetup

import (
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/config"
)

// TestBuild: the agent's start-up carries every setting of the file into
// agent.Config (parallelism, heartbeat misses, the whole backoff, the
// endpoint stagger, one endpoint per URI) with the credential's runner,
// and leaves the host's own fields (Executor, Role, Version) unset.
func TestBuild(t *testing.T) {
	var cfg config.Agent
	pki, err := DevAgent(filepath.Join(t.TempDir(), "pki"), "a1", &cfg.ControlPlane)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ControlPlane.Endpoints = []string{"quic://127.0.0.1:7443", "yamux://127.0.0.1:7444"}
	cfg.MaxParallel, cfg.HeartbeatMisses = 3, 5
	cfg.Backoff.AuthAfter, cfg.Backoff.AuthMax.Duration = 4, 40*time.Minute
	cfg.Fallback.EndpointStagger = []config.Duration{{Duration: 300 * time.Millisecond}}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ac, err := Build(&cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := pki.Agent("a1")
	if ac.Runner != a.Runner || ac.Credentials == nil || len(ac.Endpoints) != 2 {
		t.Errorf("runner %v (want %v), credentials %v, %d endpoints (want 2)", ac.Runner, a.Runner, ac.Credentials, len(ac.Endpoints))
	}
	if ac.MaxParallel != 3 || ac.HeartbeatMisses != 5 {
		t.Errorf("MaxParallel %d, HeartbeatMisses %d; want 3 and 5", ac.MaxParallel, ac.HeartbeatMisses)
	}
	if b := ac.Backoff; b.Base != cfg.Backoff.Base.Duration || b.Max != cfg.Backoff.Max.Duration || b.AuthAfter != 4 || b.AuthMax != 40*time.Minute {
		t.Errorf("backoff %+v; want the file's %+v", b, cfg.Backoff)
	}
	if len(ac.FallbackStagger) != 1 || ac.FallbackStagger[0] != 300*time.Millisecond {
		t.Errorf("stagger %v; want [300ms]", ac.FallbackStagger)
	}
	if ac.Executor != nil || ac.Version != "" || ac.Role != 0 {
		t.Errorf("host fields set by Build: executor %v, version %q, role %v", ac.Executor, ac.Version, ac.Role)
	}
}
