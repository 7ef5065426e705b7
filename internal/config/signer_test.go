package config

import (
	"os"
	"strings"
	"testing"
	"time"
)

func parseSigner(t *testing.T, data string) (*Signer, error) {
	t.Helper()
	var s Signer
	if err := decode("signer.toml", []byte(data), &s); err != nil {
		return nil, err
	}
	s.ApplyDefaults()
	return &s, s.Validate()
}

// TestSignerDocsExample parses the signer configuration of
// docs/operations.md ("Running forgeyard-signer").
func TestSignerDocsExample(t *testing.T) {
	b, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "## Running forgeyard-signer")
	if !ok {
		t.Fatal("docs/operations.md lacks the forgeyard-signer section")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	_, rest, ok := strings.Cut(sec, "```toml\n")
	if !ok {
		t.Fatal("no toml block")
	}
	block, _, _ := strings.Cut(rest, "```")
	s, err := parseSigner(t, block)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Keys) != 1 || s.Keys[0].Ref != "release-ed25519" || len(s.Policies) != 1 || !s.Policy.RequireMaterial ||
		s.Policy.MaxProofLifetime.Duration != 15*time.Minute || len(s.Agent().Endpoints()) != 1 {
		t.Errorf("parsed %+v", s)
	}
}

func TestSignerValidate(t *testing.T) {
	base := "[control_plane]\nendpoints = [\"quic://h:1\"]\n[control_plane.credential]\ncertificate = \"c\"\nprivate_key = \"k\"\nca = \"a\"\n"
	for _, c := range []struct{ extra, want string }{
		{"", "keys: required"},
		{"[[keys]]\nref = \"a\"\nfile = \"f\"\n[[keys]]\nref = \"a\"\nfile = \"g\"\n", "keys[1].ref"},
		{"[[keys]]\nref = \"a\"\n", "keys[0].file: required"},
		{"[[keys]]\nref = \"a\"\nfile = \"f\"\n[[policies]]\nid = \"p\"\n", "policies[0].authority_key: required"},
		{"[[keys]]\nref = \"a\"\nfile = \"f\"\n[policy]\nmax_proof_lifetime = \"48h\"\n", "policy.max_proof_lifetime"},
		{"[[keys]]\nref = \"" + strings.Repeat("x", 53) + "\"\nfile = \"f\"\n", "keys[0].ref"},
	} {
		_, err := parseSigner(t, base+c.extra)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.extra, err, c.want)
		}
	}
	if _, err := parseSigner(t, base+"[[keys]]\nref = \"a\"\nfile = \"f\"\n"); err != nil {
		t.Errorf("minimal signer: %v", err)
	}
}
