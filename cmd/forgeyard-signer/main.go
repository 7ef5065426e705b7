// Command forgeyard-signer runs a Forgeyard signing worker (§99): it
// connects to the daemon like an agent (same endpoints, credential,
// fallback and reconnect), registers with the signing role, and answers
// typed sign requests with the keys it holds locally (semantics/signer).
// It runs no attempts and accepts no execution message: the daemon can send
// it nothing but sign requests (everything else is answered
// RoleForbidden), and it signs a digest only when the request's policy
// proof is attested by a policy authority it trusts.
//
//	forgeyard-signer --config /etc/forgeyard/signer.toml
//	forgeyard-signer keygen --ref release-ed25519 --algorithm ed25519 --out /etc/forgeyard/signer/release-ed25519.pem
//	forgeyard-signer policy-keygen --out policy.pem --pub policy.pub.pem
//	forgeyard-signer --dev-pki ./.dev-pki --dev-agent signer --endpoint quic://127.0.0.1:7443 \
//	    --key-file release-ed25519=./release-ed25519.pem --policy release-signing/v1=./policy.pub.pem
//
// keygen writes a new PKCS#8 PEM key with mode 0600 (never over an
// existing file) and prints its public key; policy-keygen makes the Ed25519
// key pair of a policy authority (its public key goes in [[policies]]).
//
// SIGINT or SIGTERM stops the worker. Exit status: 0 after SIGINT/SIGTERM,
// 1 on a fatal error, 2 on a usage or configuration error.
package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"forgeyard.dev/transport/internal/buildinfo"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/agentsetup"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/signer"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/signing"
)

// Version is reported to the daemon in TransportHelloV1:
// forgeyard-signer/<module version> (internal/buildinfo), like the agent's.
var Version = buildinfo.Get().UserAgent("forgeyard-signer")

func main() {
	cli.Main(func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
		return run(ctx, args, stdout, stderr, nil)
	})
}

type flags struct {
	cli.RoleFlags // --config, --log-*
	cp            agentsetup.ControlPlaneFlags
	keyFiles      cli.StringList
	policies      cli.StringList
}

func newFlagSet(f *flags, out io.Writer) *flag.FlagSet {
	fs := cli.NewRoleFlagSet("forgeyard-signer", out, &f.RoleFlags, false)
	fs.Var((*cli.StringList)(&f.cp.Endpoints), "endpoint", "daemon endpoint `URI`, repeatable (key: control_plane.endpoints; replaces the file's list)")
	fs.StringVar(&f.cp.ServerName, "server-name", "", "`name` checked against the daemon certificate (key: control_plane.server_name)")
	fs.StringVar(&f.cp.Cert, "cert", "", "worker certificate PEM `file`, bound to the RunnerId (key: control_plane.credential.certificate)")
	fs.StringVar(&f.cp.Key, "key", "", "worker TLS private key PEM `file` (key: control_plane.credential.private_key)")
	fs.StringVar(&f.cp.CA, "ca", "", "CA PEM `file` that signs the daemon certificate (key: control_plane.credential.ca)")
	fs.StringVar(&f.cp.DevPKI, "dev-pki", "", "DEVELOPMENT ONLY: create/reuse a dev PKI in `dir` and use agent --dev-agent's certificate")
	fs.StringVar(&f.cp.DevAgent, "dev-agent", "signer", "agent `name` inside --dev-pki")
	fs.Var(&f.keyFiles, "key-file", "signing key `ref=file`, repeatable (key: [[keys]]; replaces the file's list)")
	fs.Var(&f.policies, "policy", "trusted policy `id=authority-public-key-file`, repeatable (key: [[policies]]; replaces the file's list)")
	return fs
}

type testHooks struct {
	ready func(a *agent.Agent, w *signer.Worker)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, th *testHooks) int {
	if len(args) > 0 && args[0] == "keygen" {
		return runKeygen(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "policy-keygen" {
		return runPolicyKeygen(args[1:], stdout, stderr)
	}
	var f flags
	fs := newFlagSet(&f, stderr)
	if code, ok := cli.ParseNoArgs(fs, args, stdout, stderr, "forgeyard-signer"); !ok {
		return code
	}
	cfg, err := buildConfig(fs, &f)
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard-signer: %v\n", err)
		return cli.ExitUsage
	}
	log := cfg.Log.NewLogger(stderr)
	w, err := newWorker(cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard-signer: %v\n", err)
		return cli.ExitUsage
	}
	a, err := newAgent(cfg, w, log)
	if err != nil {
		return agentsetup.StartFailed(stderr, "forgeyard-signer", err, "")
	}
	defer a.Close()
	log.Info("signing worker starting", "session", a.Session(), "endpoints", cfg.ControlPlane.Endpoints, "keys", w.Labels())
	if th != nil && th.ready != nil {
		th.ready(a, w)
	}
	return agentsetup.Run(ctx, a, log, stderr, "forgeyard-signer", "signing worker")
}

// setPairs replaces *dst, when the repeatable flag --key was set, with its
// NAME=FILE values l, each made into an entry by entry.
func setPairs[T any](set config.SetFlags, key string, l []string, dst *[]T, entry func(name, file string) T) error {
	if !set[key] {
		return nil
	}
	var out []T
	for _, s := range l {
		a, b, ok := strings.Cut(s, "=")
		if !ok || a == "" || b == "" {
			return fmt.Errorf("--%s %q: want NAME=FILE", key, s)
		}
		out = append(out, entry(a, b))
	}
	*dst = out
	return nil
}

func buildConfig(fs *flag.FlagSet, f *flags) (*config.Signer, error) {
	return cli.LoadConfig(fs, f.ConfigFile, config.ReadSigner, func(cfg *config.Signer, set config.SetFlags) error {
		if err := f.cp.Apply(&cfg.ControlPlane, set); err != nil {
			return err
		}
		if err := setPairs(set, "key-file", f.keyFiles, &cfg.Keys, func(name, file string) config.SignerKey {
			return config.SignerKey{Ref: name, File: file}
		}); err != nil {
			return err
		}
		if err := setPairs(set, "policy", f.policies, &cfg.Policies, func(name, file string) config.SignerPolicy {
			return config.SignerPolicy{ID: name, AuthorityKey: file}
		}); err != nil {
			return err
		}
		f.ApplyLog(&cfg.Log, set)
		return nil
	})
}

// newWorker loads the keys and the trusted policy authorities.
func newWorker(cfg *config.Signer, log *slog.Logger) (*signer.Worker, error) {
	var keys []signer.Key
	for i, k := range cfg.Keys {
		key, err := signer.LoadKeyFile(k.File, k.Ref)
		if err != nil {
			return nil, fmt.Errorf("keys[%d]: %w", i, err)
		}
		keys = append(keys, key)
	}
	auth := map[string]ed25519.PublicKey{}
	for i, p := range cfg.Policies {
		b, err := os.ReadFile(p.AuthorityKey)
		if err != nil {
			return nil, fmt.Errorf("policies[%d].authority_key: %w", i, err)
		}
		pub, err := signer.ParsePublicKeyPEM(b)
		if err != nil {
			return nil, fmt.Errorf("policies[%d].authority_key %s: %w", i, p.AuthorityKey, err)
		}
		ek, ok := pub.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("policies[%d].authority_key %s: not an Ed25519 public key", i, p.AuthorityKey)
		}
		auth[p.ID] = ek
	}
	return signer.New(signer.Config{Keys: keys, Logger: log, Policy: signer.Policy{Authorities: auth,
		RequireMaterial: cfg.Policy.RequireMaterial, MaxProofLifetime: cfg.Policy.MaxProofLifetime.Duration,
		ClockSkew: cfg.Policy.ClockSkew.Duration}})
}

// newAgent assembles the worker's endpoint like forgeyard-agent's
// (agentsetup.Build), with the signing role and the worker as its service.
func newAgent(cfg *config.Signer, w *signer.Worker, log *slog.Logger) (*agent.Agent, error) {
	ac, err := agentsetup.Build(cfg.Agent(), log)
	if err != nil {
		return nil, err
	}
	ac.Version, ac.Features = Version, wire.Implemented
	return agent.New(w.AgentConfig(ac))
}

func runKeygen(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("forgeyard-signer keygen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ref := fs.String("ref", "", "key `ref` (the name sign requests use)")
	alg := fs.String("algorithm", "ed25519", "ed25519 or p256")
	out := fs.String("out", "", "private key `file` to create (mode 0600; never overwritten)")
	pub := fs.String("pub", "", "also write the public key PEM to `file`")
	if code, ok := cli.ParseNoArgs(fs, args, stdout, stderr, "forgeyard-signer keygen"); !ok {
		return code
	}
	var a signing.SignatureAlgorithm
	switch *alg {
	case "ed25519":
		a = signing.Ed25519
	case "p256", "ecdsa-p256":
		a = signing.EcdsaP256Sha256
	default:
		fmt.Fprintf(stderr, "forgeyard-signer keygen: --algorithm %q: want ed25519 or p256\n", *alg)
		return cli.ExitUsage
	}
	if *ref == "" || *out == "" {
		fmt.Fprintln(stderr, "forgeyard-signer keygen: --ref and --out are required")
		return cli.ExitUsage
	}
	k, err := signer.GenerateKeyFile(*out, *ref, a)
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard-signer keygen: %v\n", err)
		return cli.ExitFail
	}
	p, err := k.PublicKeyPEM()
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard-signer keygen: %v\n", err)
		return cli.ExitFail
	}
	if *pub != "" {
		if err := os.WriteFile(*pub, p, 0o644); err != nil {
			fmt.Fprintf(stderr, "forgeyard-signer keygen: %v\n", err)
			return cli.ExitFail
		}
	}
	fmt.Fprintf(stdout, "created %s key %q in %s (mode 0600)\n%s", k.Algorithm, k.Ref, *out, p)
	return cli.ExitOK
}

func runPolicyKeygen(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("forgeyard-signer policy-keygen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "policy authority private key `file` to create (mode 0600)")
	pubOut := fs.String("pub", "", "public key `file` to write (goes in [[policies]] authority_key)")
	if code, ok := cli.ParseNoArgs(fs, args, stdout, stderr, "forgeyard-signer policy-keygen"); !ok {
		return code
	}
	if *out == "" || *pubOut == "" {
		fmt.Fprintln(stderr, "forgeyard-signer policy-keygen: --out and --pub are required")
		return cli.ExitUsage
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard-signer policy-keygen: %v\n", err)
		return cli.ExitFail
	}
	der, _ := x509.MarshalPKCS8PrivateKey(priv)
	pder, _ := x509.MarshalPKIXPublicKey(pub)
	f, err := os.OpenFile(*out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard-signer policy-keygen: %v\n", err)
		return cli.ExitFail
	}
	if err := errors.Join(pem.Encode(f, &pem.Block{Type: "PRIVATE KEY", Bytes: der}), f.Close()); err != nil {
		fmt.Fprintf(stderr, "forgeyard-signer policy-keygen: %v\n", err)
		return cli.ExitFail
	}
	if err := os.WriteFile(*pubOut, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pder}), 0o644); err != nil {
		fmt.Fprintf(stderr, "forgeyard-signer policy-keygen: %v\n", err)
		return cli.ExitFail
	}
	fmt.Fprintf(stdout, "created policy authority key %s (mode 0600) and public key %s\n", *out, *pubOut)
	return cli.ExitOK
}
