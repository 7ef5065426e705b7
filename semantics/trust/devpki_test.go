package trust_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

func mustGen(t *testing.T, dir string, o trust.DevPKIOptions) *trust.DevPKI {
	t.Helper()
	p, err := trust.GenerateDevPKI(dir, o)
	if err != nil {
		t.Fatalf("GenerateDevPKI: %v", err)
	}
	return p
}

func readAll(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = b
	}
	return out
}

func TestGenerateDevPKIFilesAndModes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	p := mustGen(t, dir, trust.DevPKIOptions{Agents: []string{"b", "a"}, ServerNames: []string{"daemon.example", "10.0.0.7"}})

	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("dir mode: %v %v", st, err)
	}
	want := map[string]os.FileMode{
		"ca.pem": 0o644, "ca-key.pem": 0o600, "server.pem": 0o644, "server-key.pem": 0o600,
		"agent-a.pem": 0o644, "agent-a-key.pem": 0o600, "agent-b.pem": 0o644, "agent-b-key.pem": 0o600,
		"dev-pki.json": 0o644,
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != len(want) {
		t.Errorf("%d files in dir, want %d", len(ents), len(want))
	}
	for name, mode := range want {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if st.Mode().Perm() != mode {
			t.Errorf("%s mode %#o, want %#o", name, st.Mode().Perm(), mode)
		}
	}
	if !p.CA.Created || !p.Server.Created || len(p.Agents) != 2 || p.Agents[0].Name != "a" || !p.Agents[0].Created {
		t.Fatalf("result: %+v", p)
	}
	if p.Agents[0].Runner == p.Agents[1].Runner || p.Agents[0].Runner == (wire.RunnerId{}) {
		t.Fatal("agents must get distinct non-zero RunnerIds")
	}
	wantNames := []string{"localhost", "daemon.example", "127.0.0.1", "::1", "10.0.0.7"}
	if !slices.Equal(p.Server.Names, wantNames) {
		t.Errorf("server names %v, want %v", p.Server.Names, wantNames)
	}
	if d := time.Until(p.Server.NotAfter); d < 89*24*time.Hour || d > 90*24*time.Hour {
		t.Errorf("server validity %v, want ~90 days", d)
	}
	if d := time.Until(p.CA.NotAfter); d < 364*24*time.Hour || d > 365*24*time.Hour {
		t.Errorf("CA validity %v, want ~1 year", d)
	}

	// The files work: a real handshake with configs loaded from them.
	a := p.Agents[0]
	srv, err := trust.ServerConfig(trust.ServerFiles{CertFile: p.Server.CertFile, KeyFile: p.Server.KeyFile, ClientCAFile: p.CA.CertFile, RequireClientCert: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"localhost", "127.0.0.1", "::1", "daemon.example", "10.0.0.7"} {
		cli, err := trust.ClientConfig(trust.ClientFiles{CertFile: a.CertFile, KeyFile: a.KeyFile, CAFile: p.CA.CertFile, ServerName: name})
		if err != nil {
			t.Fatal(err)
		}
		r := trusttest.Handshake(t, srv, cli)
		if !r.OK() {
			t.Fatalf("%s: handshake server=%v client=%v", name, r.ServerErr, r.ClientErr)
		}
		id, err := trust.VerifyPeer(r.ServerState, time.Now())
		if err != nil || id.Runner != a.Runner {
			t.Fatalf("VerifyPeer = %v, %v; want %v", id.Runner, err, a.Runner)
		}
		if !r.ClientState.PeerCertificates[0].NotBefore.Before(time.Now().Add(-4 * time.Minute)) {
			t.Errorf("server certificate is not backdated for clock skew")
		}
	}

	// The manifest maps names to RunnerIds and expiry, with relative paths.
	raw, err := os.ReadFile(p.Manifest)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Version int
		Agents  map[string]struct {
			RunnerID wire.RunnerId `json:"runner_id"`
			Cert     string
			Key      string
			NotAfter time.Time `json:"not_after"`
		}
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	if m.Version != 1 || m.Agents["a"].RunnerID != a.Runner || m.Agents["a"].Cert != "agent-a.pem" || !m.Agents["a"].NotAfter.Equal(a.NotAfter) {
		t.Fatalf("manifest %s", raw)
	}
	if bytes.Contains(raw, []byte("PRIVATE")) {
		t.Fatal("manifest contains key material")
	}
	loaded, err := trust.LoadDevPKI(dir)
	if err != nil {
		t.Fatal(err)
	}
	if la, ok := loaded.Agent("b"); !ok || la.Runner != p.Agents[1].Runner || la.CertFile != p.Agents[1].CertFile {
		t.Fatalf("LoadDevPKI agent b = %+v", la)
	}
}

func TestGenerateDevPKIIdempotent(t *testing.T) {
	dir := t.TempDir()
	first := mustGen(t, dir, trust.DevPKIOptions{Agents: []string{"a"}})
	before := readAll(t, dir)

	again := mustGen(t, dir, trust.DevPKIOptions{Agents: []string{"a"}})
	if again.CA.Created || again.Server.Created || again.Agents[0].Created {
		t.Fatalf("second run created files: %+v", again)
	}
	if again.Agents[0].Runner != first.Agents[0].Runner {
		t.Fatal("RunnerId changed on rerun")
	}
	after := readAll(t, dir)
	for name, b := range before {
		if name != trust.DevManifestFile && !bytes.Equal(b, after[name]) {
			t.Errorf("%s was rewritten", name)
		}
	}

	// Adding an agent keeps the others, even when not named again.
	more := mustGen(t, dir, trust.DevPKIOptions{Agents: []string{"c"}})
	if len(more.Agents) != 2 || more.Agents[1].Name != "c" || !more.Agents[1].Created || more.Agents[0].Runner != first.Agents[0].Runner || more.Agents[0].Created {
		t.Fatalf("adding agent: %+v", more.Agents)
	}
	if !bytes.Equal(readAll(t, dir)["ca-key.pem"], before["ca-key.pem"]) {
		t.Fatal("CA key changed")
	}

	// Force regenerates everything, including agents only in the manifest.
	forced := mustGen(t, dir, trust.DevPKIOptions{Force: true})
	if !forced.CA.Created || len(forced.Agents) != 2 || !forced.Agents[0].Created || forced.Agents[0].Runner == first.Agents[0].Runner {
		t.Fatalf("force: %+v", forced)
	}
	if bytes.Equal(readAll(t, dir)["ca-key.pem"], before["ca-key.pem"]) {
		t.Fatal("force kept the CA key")
	}
	st, _ := os.Stat(filepath.Join(dir, "agent-a-key.pem"))
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("forced key mode %#o", st.Mode().Perm())
	}
}

func TestGenerateDevPKIConflicts(t *testing.T) {
	gen := func(t *testing.T) string {
		dir := t.TempDir()
		mustGen(t, dir, trust.DevPKIOptions{Agents: []string{"a"}})
		return dir
	}
	conflict := func(t *testing.T, dir string, o trust.DevPKIOptions, mention string) {
		t.Helper()
		before := readAll(t, dir)
		_, err := trust.GenerateDevPKI(dir, o)
		if !errors.Is(err, trust.ErrDevPKIConflict) || !strings.Contains(err.Error(), mention) || !strings.Contains(err.Error(), "force") {
			t.Fatalf("err = %v; want ErrDevPKIConflict mentioning %q and force", err, mention)
		}
		after := readAll(t, dir)
		for name, b := range before {
			if !bytes.Equal(b, after[name]) {
				t.Errorf("%s changed despite the conflict", name)
			}
		}
		o.Force = true
		if _, err := trust.GenerateDevPKI(dir, o); err != nil {
			t.Fatalf("with Force: %v", err)
		}
	}
	t.Run("half a CA pair", func(t *testing.T) {
		dir := gen(t)
		os.Remove(filepath.Join(dir, "ca-key.pem"))
		conflict(t, dir, trust.DevPKIOptions{}, "ca.pem exists without ca-key.pem")
	})
	t.Run("half an agent pair", func(t *testing.T) {
		dir := gen(t)
		os.Remove(filepath.Join(dir, "agent-a.pem"))
		conflict(t, dir, trust.DevPKIOptions{Agents: []string{"a"}}, "agent-a-key.pem exists without agent-a.pem")
	})
	t.Run("new CA, old leaves", func(t *testing.T) {
		dir := gen(t)
		os.Remove(filepath.Join(dir, "ca.pem"))
		os.Remove(filepath.Join(dir, "ca-key.pem"))
		conflict(t, dir, trust.DevPKIOptions{}, "does not verify")
	})
	t.Run("server name not covered", func(t *testing.T) {
		dir := gen(t)
		conflict(t, dir, trust.DevPKIOptions{ServerNames: []string{"new.example"}}, `"new.example"`)
	})
	t.Run("swapped keys", func(t *testing.T) {
		dir := gen(t)
		k, _ := os.ReadFile(filepath.Join(dir, "agent-a-key.pem"))
		os.WriteFile(filepath.Join(dir, "server-key.pem"), k, 0o600)
		conflict(t, dir, trust.DevPKIOptions{}, "does not match")
	})
	t.Run("corrupt manifest", func(t *testing.T) {
		dir := gen(t)
		os.WriteFile(filepath.Join(dir, trust.DevManifestFile), []byte("{nope"), 0o644)
		conflict(t, dir, trust.DevPKIOptions{}, trust.DevManifestFile)
	})
	t.Run("expired CA", func(t *testing.T) {
		dir := gen(t)
		later := func() time.Time { return time.Now().Add(400 * 24 * time.Hour) }
		conflict(t, dir, trust.DevPKIOptions{Now: later}, "expired")
	})
}

func TestGenerateDevPKIWarnings(t *testing.T) {
	dir := t.TempDir()
	mustGen(t, dir, trust.DevPKIOptions{Agents: []string{"a", "gone"}})
	os.Chmod(filepath.Join(dir, "agent-a-key.pem"), 0o644)
	os.Remove(filepath.Join(dir, "agent-gone.pem"))
	os.Remove(filepath.Join(dir, "agent-gone-key.pem"))
	soon := func() time.Time { return time.Now().Add(80 * 24 * time.Hour) }
	p := mustGen(t, dir, trust.DevPKIOptions{Now: soon})
	all := strings.Join(p.Warnings, "\n")
	for _, want := range []string{"agent-a-key.pem has mode 0644", `"gone"`, "expires at"} {
		if !strings.Contains(all, want) {
			t.Errorf("warnings %q lack %q", all, want)
		}
	}
	if len(p.Agents) != 1 || p.Agents[0].Name != "a" {
		t.Fatalf("agents %+v", p.Agents)
	}
}

func TestGenerateDevPKIInvalidOptions(t *testing.T) {
	for _, o := range []trust.DevPKIOptions{
		{Agents: []string{""}},
		{Agents: []string{"../x"}},
		{Agents: []string{"a/b"}},
		{Agents: []string{"-a"}},
		{Agents: []string{strings.Repeat("a", 64)}},
		{Agents: []string{"a", "a"}},
		{ServerNames: []string{"bad name"}},
		{ServerNames: []string{""}},
		{Agents: make([]string, 1001)},
	} {
		dir := t.TempDir()
		if _, err := trust.GenerateDevPKI(dir, o); !errors.Is(err, trust.ErrInvalidDevPKIOptions) {
			t.Errorf("%v: err = %v, want ErrInvalidDevPKIOptions", o, err)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("%v: wrote %d files", o, len(ents))
		}
	}
}
