package relay_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/deviceagent"
	"forgeyard.dev/transport/semantics/signer"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/signing"
)

// startRoleDaemon is startDaemon with a content store (device installs).
func startRoleDaemon(t *testing.T, pki *trusttest.PKI) (*daemon.Daemon, string, cas.ContentStore) {
	t.Helper()
	auth, err := authority.OpenSQLite(testCtx(t), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = auth.Close() })
	store, err := cas.NewFSStore(cas.FSStoreConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	d, err := daemon.New(daemon.Config{Authority: auth, RunnerCAs: pki.CAPool(), ContentStore: store, Features: wire.Implemented})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := quic.Listen("127.0.0.1:0", pki.ServerConfig(t, serverName), quic.Config{})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = d.Serve(context.Background(), ln) }()
	t.Cleanup(func() {
		c, cc := context.WithTimeout(context.Background(), 5*time.Second)
		defer cc()
		_ = d.Shutdown(c)
		_ = ln.Close()
		<-served
	})
	return d, ln.Addr().String(), store
}

// startRolePeer runs an agent endpoint set up by setup through the relay
// listener and waits until it is connected.
func startRolePeer(t *testing.T, pki *trusttest.PKI, backend, addr string, setup func(agent.Config) agent.Config) wire.RunnerId {
	t.Helper()
	runner := wire.NewRunnerId()
	tlsConf := pki.ClientConfig(t, runner, serverName)
	cert := tlsConf.Certificates[0]
	connected := make(chan struct{}, 1)
	a, err := agent.New(setup(agent.Config{Runner: runner, Signer: cert.PrivateKey.(crypto.Signer), CertChain: cert.Certificate,
		Endpoints: []agent.Endpoint{{Address: addr, Backend: backend, Dialer: agentDialer(backend, tlsConf)}},
		Features:  wire.Implemented,
		Hooks: agent.Hooks{OnConnected: func(agent.Status) {
			select {
			case connected <- struct{}{}:
			default:
			}
		}}}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; _ = a.Close() })
	select {
	case <-connected:
	case <-time.After(10 * time.Second):
		t.Fatal("peer never connected through the relay")
	}
	return runner
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestRolesThroughRelay: a signing worker and a device agent reach the
// daemon through the relay (yamux and WebTransport to the relay, QUIC to
// the daemon): a signature verifies with the key, and a device install
// from CAS and a test run with its streamed log complete.
func TestRolesThroughRelay(t *testing.T) {
	backends(t, func(t *testing.T, backend string) {
		pki := trusttest.NewPKI(t)
		d, daddr, store := startRoleDaemon(t, pki)
		_, ln := startRelay(t, pki, backend, daddr)

		_, keyPriv, _ := ed25519.GenerateKey(rand.Reader)
		key, _ := signer.NewKey("k", keyPriv)
		authPub, authPriv, _ := ed25519.GenerateKey(rand.Reader)
		w, err := signer.New(signer.Config{Keys: []signer.Key{key}, Policy: signer.Policy{Authorities: map[string]ed25519.PublicKey{"p": authPub}}})
		if err != nil {
			t.Fatal(err)
		}
		startRolePeer(t, pki, backend, ln.Addr().String(), w.AgentConfig)
		now := uint64(time.Now().UnixMilli())
		m := &signing.SignRequestV1{KeyRef: "k", Algorithm: signing.Ed25519, Subject: sha256.Sum256([]byte("x")),
			Policy: signing.PolicyProofV1{PolicyID: "p", IssuedAtMs: now, ExpiresAtMs: now + 60_000}}
		signer.Attest(authPriv, m)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := d.Sign(ctx, daemon.SignRequest{KeyRef: m.KeyRef, Algorithm: m.Algorithm, Subject: m.Subject, Policy: m.Policy})
		if err != nil {
			t.Fatal(err)
		}
		if !signer.Verify(signing.Ed25519, key.Public(), m.Subject[:], res.Signature) {
			t.Fatal("signature through the relay does not verify")
		}

		drv := deviceagent.NewSimDriver(deviceagent.Device{ID: "dev-1", Platform: "android", Online: true})
		da, err := deviceagent.New(deviceagent.Config{Driver: drv, StoreDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		devRunner := startRolePeer(t, pki, backend, ln.Addr().String(), da.AgentConfig)
		art := []byte("suite s\ntest a pass\ntest b pass\n")
		ref := wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: sha256.Sum256(art), Size: uint64(len(art))}
		p, err := store.Create(ref)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Append(art); err != nil {
			t.Fatal(err)
		}
		if err := p.Commit(); err != nil {
			t.Fatal(err)
		}
		resv, err := d.ReserveDevice(ctx, daemon.DeviceReserve{Runner: devRunner, Device: "dev-1", Duration: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.InstallOnDevice(ctx, resv, ref); err != nil {
			t.Fatal(err)
		}
		var log syncBuf
		tr, err := d.RunDeviceTest(ctx, resv, daemon.DeviceTest{Suite: "s", Timeout: 5 * time.Second, Log: &log})
		if err != nil {
			t.Fatal(err)
		}
		if tr.Passed != 2 || log.String() != "running suite s on dev-1\nPASS a\nPASS b\n2 passed, 0 failed\n" {
			t.Fatalf("run %+v, log %q", tr, log.String())
		}
		var roles []agentwire.PeerRole
		for _, s := range d.Sessions() {
			if s.Backend != "quic" {
				t.Errorf("daemon saw %s, want the relay's quic", s.Backend)
			}
			roles = append(roles, s.Role)
		}
		if len(roles) != 2 {
			t.Fatalf("sessions %v", roles)
		}
	})
}
