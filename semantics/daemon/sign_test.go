package daemon_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/signer"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/device"
	"forgeyard.dev/transport/wire/registry"
	"forgeyard.dev/transport/wire/signing"
)

// signWorld is a daemon with a signing worker holding an Ed25519 and an
// ECDSA P-256 key (files created 0600 and loaded back), trusting one
// policy authority.
type signWorld struct {
	w         *enginetest.World
	id        enginetest.Identity
	worker    *signer.Worker
	keys      map[string]signer.Key
	authority ed25519.PrivateKey
}

const testPolicy = "release-signing/v1"

// tolerantPeer: the role tests send requests over one transport and check
// the answers, not the dead-link rule (it has its own tests). On a loaded
// 2-core machine (-race, parallel binaries) a 3-interval heartbeat gap of
// FastTiming's 100 ms made a device agent reconnect under a request in one
// -race run; 10 intervals keep the link.
func tolerantPeer(c *agent.Config) { c.HeartbeatMisses = 10 }

func newSignWorld(t *testing.T, b enginetest.Backend) *signWorld {
	t.Helper()
	w := enginetest.NewWorld(t, b)
	dir := t.TempDir()
	sw := &signWorld{w: w, id: w.NewIdentity(), keys: map[string]signer.Key{}}
	for ref, alg := range map[string]signing.SignatureAlgorithm{"release-ed25519": signing.Ed25519, "attest-p256": signing.EcdsaP256Sha256} {
		path := filepath.Join(dir, ref+".pem")
		if _, err := signer.GenerateKeyFile(path, ref, alg); err != nil {
			t.Fatal(err)
		}
		k, err := signer.LoadKeyFile(path, ref)
		if err != nil {
			t.Fatal(err)
		}
		sw.keys[ref] = k
	}
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	sw.authority = priv
	worker, err := signer.New(signer.Config{Keys: []signer.Key{sw.keys["release-ed25519"], sw.keys["attest-p256"]},
		Policy: signer.Policy{Authorities: map[string]ed25519.PublicKey{testPolicy: pub}, RequireMaterial: true}})
	if err != nil {
		t.Fatal(err)
	}
	sw.worker = worker
	a, _, _ := w.StartAgent(sw.id, nil, tolerantPeer, func(c *agent.Config) { *c = worker.AgentConfig(*c) })
	enginetest.AwaitConnected(t, a)
	return sw
}

// request returns a request for key ref over a fresh subject, attested by
// the world's policy authority, valid for a minute from now.
func (sw *signWorld) request(ref string) daemon.SignRequest {
	blob := []byte("artifact " + ref)
	mat := wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: sha256.Sum256(blob), Size: uint64(len(blob))}
	now := uint64(time.Now().UnixMilli())
	m := &signing.SignRequestV1{KeyRef: ref, Algorithm: sw.keys[ref].Algorithm, Subject: sha256.Sum256([]byte("statement " + ref)),
		MaterialRefs: []wire.CasObjectRef{mat},
		Policy:       signing.PolicyProofV1{PolicyID: testPolicy, IssuedAtMs: now - 1000, ExpiresAtMs: now + 60_000}}
	signer.Attest(sw.authority, m)
	return daemon.SignRequest{KeyRef: m.KeyRef, Algorithm: m.Algorithm, Subject: m.Subject, MaterialRefs: m.MaterialRefs, Policy: m.Policy}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestSignEndToEnd (§99): the host asks the daemon for signatures; the
// daemon routes each request to the worker advertising the key; the
// signatures verify with the keys' public keys.
func TestSignEndToEnd(t *testing.T) {
	enginetest.DataBackends(t, func(t *testing.T, b enginetest.Backend) {
		sw := newSignWorld(t, b)
		for _, ref := range []string{"release-ed25519", "attest-p256"} {
			req := sw.request(ref)
			res, err := sw.w.D.Sign(ctxT(t, 10*time.Second), req)
			if err != nil {
				t.Fatalf("%s: %v", ref, err)
			}
			if res.Runner != sw.id.Runner {
				t.Fatalf("%s signed by %s", ref, res.Runner)
			}
			if !signer.Verify(req.Algorithm, sw.keys[ref].Public(), req.Subject[:], res.Signature) {
				t.Fatalf("%s: signature does not verify", ref)
			}
			other := req.Subject
			other[0] ^= 1
			if signer.Verify(req.Algorithm, sw.keys[ref].Public(), other[:], res.Signature) {
				t.Fatalf("%s: signature verifies another subject", ref)
			}
		}
		if st := sw.worker.Stats(); st.Signed != 2 || st.Refused != 0 {
			t.Fatalf("worker stats %+v", st)
		}
	})
}

// TestSignRefusals: requests the worker's policy does not allow come back
// as SignRefusedError with the stable code, and nothing is signed.
func TestSignRefusals(t *testing.T) {
	enginetest.DataBackends(t, func(t *testing.T, b enginetest.Backend) {
		sw := newSignWorld(t, b)
		_, stranger, _ := ed25519.GenerateKey(rand.Reader)
		cases := []struct {
			name string
			mut  func(r *daemon.SignRequest)
			want signer.RefusalCode
		}{
			{"wrong algorithm", func(r *daemon.SignRequest) { r.Algorithm = signing.EcdsaP256Sha256 }, signer.RefuseAlgorithm},
			{"untrusted policy", func(r *daemon.SignRequest) { r.Policy.PolicyID = "other/v1" }, signer.RefuseUnknownPolicy},
			{"subject changed after attestation", func(r *daemon.SignRequest) { r.Subject[3] ^= 0xff }, signer.RefuseBadAttestation},
			{"attested by a stranger", func(r *daemon.SignRequest) {
				m := &signing.SignRequestV1{KeyRef: r.KeyRef, Algorithm: r.Algorithm, Subject: r.Subject, MaterialRefs: r.MaterialRefs, Policy: r.Policy}
				signer.Attest(stranger, m)
				r.Policy = m.Policy
			}, signer.RefuseBadAttestation},
			{"expired proof", func(r *daemon.SignRequest) {
				now := uint64(time.Now().UnixMilli())
				r.Policy.IssuedAtMs, r.Policy.ExpiresAtMs = now-120_000, now-60_000
				m := &signing.SignRequestV1{KeyRef: r.KeyRef, Algorithm: r.Algorithm, Subject: r.Subject, MaterialRefs: r.MaterialRefs, Policy: r.Policy}
				signer.Attest(sw.authority, m)
				r.Policy = m.Policy
			}, signer.RefuseProofNotValidNow},
			{"no material", func(r *daemon.SignRequest) {
				r.MaterialRefs = nil
				m := &signing.SignRequestV1{KeyRef: r.KeyRef, Algorithm: r.Algorithm, Subject: r.Subject, Policy: r.Policy}
				signer.Attest(sw.authority, m)
				r.Policy = m.Policy
			}, signer.RefuseMaterial},
		}
		for _, tc := range cases {
			req := sw.request("release-ed25519")
			tc.mut(&req)
			_, err := sw.w.D.Sign(ctxT(t, 10*time.Second), req)
			var re *daemon.SignRefusedError
			if !errors.As(err, &re) || re.Code != string(tc.want) || signer.ParseRefusal(re.Reason) != tc.want {
				t.Fatalf("%s: %v, want refusal %s", tc.name, err, tc.want)
			}
		}
		// A key no worker advertises is not sent anywhere.
		req := sw.request("release-ed25519")
		req.KeyRef = "missing-key"
		if _, err := sw.w.D.Sign(ctxT(t, 10*time.Second), req); !errors.Is(err, daemon.ErrNoSigningWorker) {
			t.Fatalf("unknown key: %v", err)
		}
		// The same request sent to the worker by runner: refused by the worker.
		req.Runner = sw.id.Runner
		_, err := sw.w.D.Sign(ctxT(t, 10*time.Second), req)
		var re *daemon.SignRefusedError
		if !errors.As(err, &re) || re.Code != string(signer.RefuseUnknownKey) {
			t.Fatalf("unknown key sent to the worker: %v", err)
		}
		if st := sw.worker.Stats(); st.Signed != 0 || st.Refused != int64(len(cases))+1 {
			t.Fatalf("worker stats %+v", st)
		}
	})
}

// TestSignDeadline: Sign waits for the worker's answer until ctx's
// deadline, and no longer.
func TestSignDeadline(t *testing.T) {
	enginetest.DataBackends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		stall := agent.ServiceFunc(func(ctx context.Context, _ agent.ServiceRequest) wire.Message {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		})
		a, _, _ := w.StartAgent(id, nil, tolerantPeer, func(c *agent.Config) {
			c.Role, c.Service, c.Executor = agentwire.RoleSigningWorker, stall, nil
		})
		enginetest.AwaitConnected(t, a)
		pub := [32]byte{1}
		req := daemon.SignRequest{Runner: id.Runner, KeyRef: "k", Algorithm: signing.Ed25519, Subject: sha256.Sum256(pub[:]),
			Policy: signing.PolicyProofV1{PolicyID: "p", Attestation: []byte{1}, IssuedAtMs: 1, ExpiresAtMs: 2}}
		const deadline = 300 * time.Millisecond
		start := time.Now()
		_, err := w.D.Sign(ctxT(t, deadline), req)
		el := time.Since(start)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Sign against a stalled worker: %v", err)
		}
		if el < deadline || el > deadline+2*time.Second {
			t.Fatalf("Sign returned after %v with a %v deadline", el, deadline)
		}
	})
}

// TestSigningWorkerRefusesExecutionMessages (§191, §300): a real signing
// worker answers every execution message and the device family with
// RoleForbidden, and signs nothing; the daemon offers it no lease.
func TestSigningWorkerRefusesExecutionMessages(t *testing.T) {
	enginetest.DataBackends(t, func(t *testing.T, b enginetest.Backend) {
		sw := newSignWorld(t, b)
		samples := map[wire.MessageTypeId]wire.Message{}
		for _, m := range registry.Samples() {
			if _, seen := samples[m.MessageType()]; !seen {
				samples[m.MessageType()] = m
			}
		}
		for _, typ := range []wire.MessageTypeId{agentwire.MsgLeaseOffer, agentwire.MsgCancelAttempt, agentwire.MsgLeaseProbe,
			agentwire.MsgSecretMaterial, agentwire.MsgResyncResponse, device.MsgRunTest, device.MsgInstall, signing.MsgSignResponse} {
			_, err := daemon.CallRunner(ctxT(t, 5*time.Second), sw.w.D, sw.id.Runner, samples[typ])
			wantWireErr(t, err, wire.ErrCodeRoleForbidden)
		}
		if _, err := sw.w.D.OfferLease(context.Background(), sw.id.Runner, enginetest.Offer(1)); err != daemon.ErrRoleForbidden {
			t.Fatalf("OfferLease to a signing worker: %v", err)
		}
		if st := sw.worker.Stats(); st.Signed != 0 || st.Refused != 0 {
			t.Fatalf("forbidden messages reached the worker: %+v", st)
		}
	})
}
