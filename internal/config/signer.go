package config

import (
	"fmt"
	"time"
)

// MaxSignerKeys bounds keys (and policies) of a signing worker.
const MaxSignerKeys = 32

// Signer is the forgeyard-signer configuration file: the signing worker
// (§99). The control plane, capabilities, backoff and log sections are the
// agent's.
//
//	[control_plane]
//	endpoints = ["quic://forgeyard.example.internal:7443"]
//
//	[control_plane.credential]
//	certificate = "/etc/forgeyard/signer.pem"
//	private_key = "/etc/forgeyard/signer-key.pem"
//	ca = "/etc/forgeyard/ca.pem"
//
//	[[keys]]                   # created by `forgeyard-signer keygen`, mode 0600
//	ref = "release-ed25519"
//	file = "/etc/forgeyard/signer/release-ed25519.pem"
//
//	[[policies]]               # whose attestations this worker accepts
//	id = "release-signing/v1"
//	authority_key = "/etc/forgeyard/signer/release-policy.pub.pem"
//
//	[policy]                   # all optional (defaults shown)
//	require_material = false
//	max_proof_lifetime = "15m"
//	clock_skew = "0s"
type Signer struct {
	ControlPlane ControlPlane   `toml:"control_plane"`
	Capabilities Capabilities   `toml:"capabilities"`
	Keys         []SignerKey    `toml:"keys"`
	Policies     []SignerPolicy `toml:"policies"`
	Policy       SignerRules    `toml:"policy"`
	Backoff      Backoff        `toml:"backoff"`
	Log          Logging        `toml:"log"`
}

// SignerKey names one key file of the worker.
type SignerKey struct {
	Ref  string `toml:"ref"`  // the name sign requests use
	File string `toml:"file"` // PKCS#8 PEM, Ed25519 or ECDSA P-256, mode 0600
}

// SignerPolicy is a trusted policy: its id and the PEM Ed25519 public key
// of the authority that attests requests under it.
type SignerPolicy struct {
	ID           string `toml:"id"`
	AuthorityKey string `toml:"authority_key"`
}

// SignerRules are the policy checks beyond the attestation.
type SignerRules struct {
	RequireMaterial  bool     `toml:"require_material"`
	MaxProofLifetime Duration `toml:"max_proof_lifetime"`
	ClockSkew        Duration `toml:"clock_skew"`
}

// agent is the agent configuration the shared sections make.
func (s *Signer) agent() *Agent {
	return &Agent{ControlPlane: s.ControlPlane, Capabilities: s.Capabilities, MaxParallel: 1, Backoff: s.Backoff, Log: s.Log}
}

// Agent returns the shared sections as an agent configuration (defaults
// applied), for the agent's assembly (internal/setup/agentsetup).
func (s *Signer) Agent() *Agent { a := s.agent(); a.ApplyDefaults(); return a }

// ApplyDefaults fills zero fields with their defaults.
func (s *Signer) ApplyDefaults() {
	a := s.agent()
	a.ApplyDefaults()
	s.ControlPlane, s.Capabilities, s.Backoff = a.ControlPlane, a.Capabilities, a.Backoff
	if s.Policy.MaxProofLifetime.Duration == 0 {
		s.Policy.MaxProofLifetime.Duration = 15 * time.Minute
	}
}

// Validate checks s after ApplyDefaults and returns the first problem as
// an *Error.
func (s *Signer) Validate() error {
	if err := s.agent().Validate(); err != nil {
		return err
	}
	if len(s.Keys) == 0 {
		return invalid("keys", "required: at least one [[keys]] entry with ref and file (create one with `forgeyard-signer keygen`)")
	}
	if len(s.Keys) > MaxSignerKeys || len(s.Policies) > MaxSignerKeys {
		return invalid("keys", "at most %d keys and %d policies", MaxSignerKeys, MaxSignerKeys)
	}
	refs := map[string]bool{}
	for i, k := range s.Keys {
		if err := checkNamedFile(fmt.Sprintf("keys[%d]", i), refs, "ref", k.Ref, 52, "file", k.File, "the PEM private key"); err != nil {
			return err
		}
	}
	ids := map[string]bool{}
	for i, p := range s.Policies {
		if err := checkNamedFile(fmt.Sprintf("policies[%d]", i), ids, "id", p.ID, 128, "authority_key", p.AuthorityKey, "the authority's PEM Ed25519 public key"); err != nil {
			return err
		}
	}
	if d := s.Policy.MaxProofLifetime.Duration; d < time.Second || d > 24*time.Hour {
		return invalid("policy.max_proof_lifetime", "%v must be 1s–24h", d)
	}
	if d := s.Policy.ClockSkew.Duration; d < 0 || d > 10*time.Minute {
		return invalid("policy.clock_skew", "%v must be 0–10m", d)
	}
	return nil
}

// checkNamedFile checks entry key of a list of named files (keys[i],
// policies[i]): its name (key nameKey) is 1–maxName bytes and not in seen
// (then added), and its file (key fileKey) is a required file path of what.
func checkNamedFile(key string, seen map[string]bool, nameKey, name string, maxName int, fileKey, file, what string) error {
	if name == "" || len(name) > maxName || seen[name] {
		return invalid(key+"."+nameKey, "%q must be 1–%d bytes and unique", name, maxName)
	}
	seen[name] = true
	if err := checkFileRef(key+"."+fileKey, file); err != nil {
		return err
	}
	if file == "" {
		return invalid(key+"."+fileKey, "required: path of %s", what)
	}
	return nil
}
