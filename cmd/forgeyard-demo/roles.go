package main

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/agentsetup"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/deviceagent"
	"forgeyard.dev/transport/semantics/signer"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/signing"
)

// rolesReport is what the signing worker and the device agent showed.
type rolesReport struct {
	SignedBy, SignKey string
	SignatureVerified bool
	RefusedCode       string
	DeviceRunner      string
	DevicePassed      uint32
	DeviceFailed      uint32
	DeviceLogLines    int
	StaleRefused      bool
	Failure           string
}

// demoArtifact is the device test artifact: a test list the simulated
// driver runs.
const demoArtifact = `suite smoke
test boot pass
test login pass
test checkout pass
`

// lineWriter prefixes every log line for the progress output and counts
// them.
type lineWriter struct {
	p     params
	buf   []byte
	lines int
}

func (l *lineWriter) Write(b []byte) (int, error) {
	l.buf = append(l.buf, b...)
	for {
		i := strings.IndexByte(string(l.buf), '\n')
		if i < 0 {
			return len(b), nil
		}
		l.lines++
		if l.p.Progress != nil {
			fmt.Fprintf(l.p.Progress, "    device log | %s\n", l.buf[:i])
		}
		l.buf = l.buf[i+1:]
	}
}

// roleAgent starts an agent endpoint named name over QUIC to addr, set up
// by setup (a signing worker or a device agent). Its certificate, for a
// fresh RunnerId, is issued in memory by the dev CA (the dev PKI's
// manifest keeps only the demo's agents).
func roleAgent(ctx context.Context, pki *trust.DevPKI, name, addr string, log *slog.Logger, setup func(agent.Config) agent.Config) (*agent.Agent, wire.RunnerId, func(), error) {
	is, err := trust.LoadIssuer(pki.CA.CertFile, pki.CA.KeyFile, time.Hour)
	if err != nil {
		return nil, wire.RunnerId{}, nil, err
	}
	key, err := trust.GenerateKey()
	if err != nil {
		return nil, wire.RunnerId{}, nil, err
	}
	der, err := trust.CreateCSR(key, "forgeyard-demo-"+name)
	if err != nil {
		return nil, wire.RunnerId{}, nil, err
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, wire.RunnerId{}, nil, err
	}
	runner := wire.NewRunnerId()
	chain, leaf, err := is.Issue(csr, runner, "forgeyard-demo-"+name)
	if err != nil {
		return nil, wire.RunnerId{}, nil, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(is.CA)
	client := &tls.Config{Certificates: []tls.Certificate{{Certificate: chain, PrivateKey: key, Leaf: leaf}}, RootCAs: roots,
		ServerName: "localhost", MinVersion: tls.VersionTLS13}
	ep, err := agentsetup.Endpoint(config.Endpoint{Backend: config.BackendQUIC, HostPort: addr}, agentsetup.EndpointOptions{TLS: client, QUIC: quic.Config{Logger: log}})
	if err != nil {
		return nil, wire.RunnerId{}, nil, err
	}
	cred := struct {
		Runner    wire.RunnerId
		Signer    crypto.Signer
		CertChain [][]byte
	}{runner, key, chain}
	connected := make(chan struct{}, 1)
	a, err := agent.New(setup(agent.Config{Runner: cred.Runner, Signer: cred.Signer, CertChain: cred.CertChain,
		Endpoints: []agent.Endpoint{ep}, Features: wire.Implemented, Version: "forgeyard-demo/1",
		Backoff: agent.Backoff{Base: 50 * time.Millisecond, Max: 500 * time.Millisecond}, Logger: log.With("side", name),
		Hooks: agent.Hooks{OnConnected: func(agent.Status) {
			select {
			case connected <- struct{}{}:
			default:
			}
		}}}))
	if err != nil {
		return nil, wire.RunnerId{}, nil, err
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(rctx) }()
	closeFn := func() { stop(); <-done; a.Close() }
	select {
	case <-connected:
	case <-ctx.Done():
		closeFn()
		return nil, wire.RunnerId{}, nil, fmt.Errorf("%s did not register: %w", name, ctx.Err())
	}
	return a, cred.Runner, closeFn, nil
}

// runRoles shows the two other peer roles (§191) on the running daemon: a
// signing worker signs a digest over the demo's payload (and refuses a
// request its policy authority did not attest), and a device agent with a
// simulated phone installs an artifact from the daemon's CAS and runs a
// test suite whose log is printed as it streams in.
func runRoles(ctx context.Context, p params, pki *trust.DevPKI, d *daemon.Daemon, quicAddr string, store cas.ContentStore, payload wire.CasObjectRef, log *slog.Logger) (rolesReport, error) {
	var rr rolesReport
	keyDir := filepath.Join(p.Dir, "signer")
	if err := os.RemoveAll(keyDir); err != nil {
		return rr, err
	}
	if err := os.MkdirAll(keyDir, 0o700); err != nil {
		return rr, err
	}

	// The signing worker: a file key (0600), one trusted policy authority.
	key, err := signer.GenerateKeyFile(filepath.Join(keyDir, "release-ed25519.pem"), "release-ed25519", signing.Ed25519)
	if err != nil {
		return rr, err
	}
	authPub, authPriv, _ := ed25519.GenerateKey(rand.Reader)
	w, err := signer.New(signer.Config{Keys: []signer.Key{key}, Logger: log.With("side", "signer"),
		Policy: signer.Policy{Authorities: map[string]ed25519.PublicKey{"release-signing/v1": authPub}, RequireMaterial: true}})
	if err != nil {
		return rr, err
	}
	_, signerRunner, stopSigner, err := roleAgent(ctx, pki, "signer", quicAddr, log, w.AgentConfig)
	if err != nil {
		return rr, err
	}
	defer stopSigner()
	now := uint64(time.Now().UnixMilli())
	m := &signing.SignRequestV1{KeyRef: key.Ref, Algorithm: key.Algorithm, Subject: sha256.Sum256([]byte("provenance of " + payload.Digest.String())),
		MaterialRefs: []wire.CasObjectRef{payload},
		Policy:       signing.PolicyProofV1{PolicyID: "release-signing/v1", IssuedAtMs: now, ExpiresAtMs: now + 5*60_000}}
	signer.Attest(authPriv, m)
	req := daemon.SignRequest{KeyRef: m.KeyRef, Algorithm: m.Algorithm, Subject: m.Subject, MaterialRefs: m.MaterialRefs, Policy: m.Policy}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	res, err := d.Sign(sctx, req)
	cancel()
	if err != nil {
		return rr, fmt.Errorf("sign: %w", err)
	}
	rr.SignedBy, rr.SignKey = res.Runner.String(), key.Ref
	rr.SignatureVerified = res.Runner == signerRunner && signer.Verify(req.Algorithm, key.Public(), req.Subject[:], res.Signature)
	progress(p, "signing worker %s: signed subject %x… with %s (%s) for policy %s over the payload; signature verified with the public key: %v",
		res.Runner, req.Subject[:6], key.Ref, key.Algorithm, m.Policy.PolicyID, rr.SignatureVerified)
	forged := req
	forged.Subject[0] ^= 0xff // not what the policy authority attested
	sctx, cancel = context.WithTimeout(ctx, 5*time.Second)
	_, err = d.Sign(sctx, forged)
	cancel()
	var re *daemon.SignRefusedError
	if errors.As(err, &re) {
		rr.RefusedCode = re.Code
	}
	progress(p, "signing worker: a request whose subject the policy authority did not attest was refused: %s", strings.TrimSpace(fmt.Sprint(err)))

	// The device agent: one simulated phone.
	drv := deviceagent.NewSimDriver(deviceagent.Device{ID: "emulator-5554", Model: "Pixel 8 (simulated)", Platform: "android", Online: true})
	da, err := deviceagent.New(deviceagent.Config{Driver: drv, StoreDir: filepath.Join(p.Dir, "device"), Logger: log.With("side", "device")})
	if err != nil {
		return rr, err
	}
	defer da.Close()
	_, devRunner, stopDevice, err := roleAgent(ctx, pki, "device", quicAddr, log, da.AgentConfig)
	if err != nil {
		return rr, err
	}
	defer stopDevice()
	rr.DeviceRunner = devRunner.String()
	artifact, err := putObject(store, []byte(demoArtifact))
	if err != nil {
		return rr, err
	}
	devs, err := d.DiscoverDevices(ctx, devRunner, "android")
	if err != nil || len(devs) != 1 {
		return rr, fmt.Errorf("discover: %v (%d devices)", err, len(devs))
	}
	resv, err := d.ReserveDevice(ctx, daemon.DeviceReserve{Runner: devRunner, Device: devs[0].ID, Duration: time.Minute})
	if err != nil {
		return rr, fmt.Errorf("reserve: %w", err)
	}
	msg, err := d.InstallOnDevice(ctx, resv, artifact)
	if err != nil {
		return rr, fmt.Errorf("install: %w", err)
	}
	progress(p, "device agent %s: %s (%s) reserved (epoch %d), artifact %x… fetched from the daemon's CAS and verified: %s",
		devRunner, devs[0].ID, devs[0].Model, resv.Epoch, artifact.Digest[:6], msg)
	lw := &lineWriter{p: p}
	tr, err := d.RunDeviceTest(ctx, resv, daemon.DeviceTest{Suite: "smoke", Timeout: 10 * time.Second, Log: lw})
	if err != nil {
		return rr, fmt.Errorf("run test: %w", err)
	}
	rr.DevicePassed, rr.DeviceFailed, rr.DeviceLogLines = tr.Passed, tr.Failed, lw.lines
	if err := d.ResetDevice(ctx, resv); err != nil {
		return rr, fmt.Errorf("reset: %w", err)
	}
	_, err = d.RunDeviceTest(ctx, resv, daemon.DeviceTest{Suite: "smoke", Timeout: time.Second})
	rr.StaleRefused = errors.Is(err, daemon.ErrStaleReservation)
	progress(p, "device agent: suite smoke %d passed, %d failed (%d log lines streamed); device reset; the old reservation's next command refused: %v",
		tr.Passed, tr.Failed, lw.lines, rr.StaleRefused)
	switch {
	case !rr.SignatureVerified:
		rr.Failure = "the signature did not verify with the signing key"
	case rr.RefusedCode != string(signer.RefuseBadAttestation):
		rr.Failure = fmt.Sprintf("the unattested request was not refused bad-attestation (%q)", rr.RefusedCode)
	case tr.Passed != 3 || tr.Failed != 0 || lw.lines != 5:
		rr.Failure = fmt.Sprintf("device test: %d passed, %d failed, %d log lines (want 3, 0, 5)", tr.Passed, tr.Failed, lw.lines)
	case !rr.StaleRefused:
		rr.Failure = "a reset reservation's command was not refused"
	}
	return rr, nil
}
