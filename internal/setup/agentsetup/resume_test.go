package agentsetup

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/daemonsetup"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// TestSessionResumptionDefault (issue 25 item 4): an agent's credential
// carries its own TLS session cache, shared by the dialers built from it
// (a redial resumes) and not by another agent's;
// control_plane.disable_session_resumption removes it.
func TestSessionResumptionDefault(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	var stls config.ServerTLS
	if _, err := daemonsetup.DevDaemon(dir, &stls); err != nil {
		t.Fatal(err)
	}
	srv, err := serversetup.ServerTLS(stls)
	if err != nil {
		t.Fatal(err)
	}
	var cp, cp2 config.ControlPlane
	if _, err := DevAgent(dir, "a1", &cp); err != nil {
		t.Fatal(err)
	}
	if _, err := DevAgent(dir, "a2", &cp2); err != nil {
		t.Fatal(err)
	}
	cred, err := LoadCredential(cp)
	if err != nil {
		t.Fatal(err)
	}
	cred2, err := LoadCredential(cp2)
	if err != nil {
		t.Fatal(err)
	}
	if cred.Client.ClientSessionCache == nil || cred.Client.ClientSessionCache == cred2.Client.ClientSessionCache {
		t.Fatal("agents have no session cache, or share one")
	}
	cp.DisableSessionResumption = true
	if off, err := LoadCredential(cp); err != nil || off.Client.ClientSessionCache != nil {
		t.Fatalf("disable_session_resumption: cache %v, %v", off.Client.ClientSessionCache, err)
	}

	l, err := yamux.Listen("127.0.0.1:0", srv, yamux.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() {
		for {
			c, err := l.Accept(ctx)
			if err != nil {
				return
			}
			defer c.CloseWithCode(wire.CloseNormal, "end")
		}
	}()
	e, err := config.ParseEndpoint("yamux://localhost:" + portOf(t, l.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	// Report the tickets the agent stores, to redial only once it has one.
	stored := make(chan struct{}, 8)
	cred.Client.ClientSessionCache = trusttest.NotifyingCache{ClientSessionCache: cred.Client.ClientSessionCache, Stored: stored}
	dial := func(c *Credential) bool {
		t.Helper()
		d, addr, err := Dialer(e, c.Client, quic.Config{}, yamux.Config{})
		if err != nil {
			t.Fatal(err)
		}
		bc, err := d.Dial(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		defer bc.CloseWithCode(wire.CloseNormal, "done")
		return bc.ConnectionState().DidResume
	}
	if dial(cred) {
		t.Fatal("the first connection resumed")
	}
	select {
	case <-stored:
	case <-ctx.Done():
		t.Fatal("the agent stored no session ticket")
	}
	if !dial(cred) {
		t.Fatal("an agent's redial (a new Dialer from its credential) did not resume")
	}
	if dial(cred2) {
		t.Fatal("another agent resumed the first agent's session")
	}
}

func portOf(t *testing.T, hostport string) string {
	t.Helper()
	i := len(hostport) - 1
	for i >= 0 && hostport[i] != ':' {
		i--
	}
	return hostport[i+1:]
}
