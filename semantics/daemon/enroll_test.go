package daemon_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/enginetest"
	"forgeyard.dev/transport/internal/pgtest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// newIDWorld is newWorldWith for identity tests: the listener accepts
// connections without a client certificate (enrollment), the daemon signs
// with the PKI's CA and polls revocations every 50 ms.
func newIDWorld(t *testing.T, b enginetest.Backend, pki *trusttest.PKI, auth authority.Authority, opts ...enginetest.WorldOpt) *enginetest.World {
	t.Helper()
	w := &enginetest.World{T: t, B: b, Pki: pki, Auth: auth, Ev: enginetest.NewEvents(), LogBuf: &enginetest.SyncBuffer{}}
	cfg := daemon.Config{Authority: auth, RunnerCAs: pki.CAPool(), Timing: enginetest.FastTiming(), Hooks: w.Ev.Hooks(),
		Logger:   slog.New(slog.NewJSONHandler(w.LogBuf, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Identity: daemon.IdentityConfig{Issuer: pki.Issuer(time.Hour), RevocationPoll: 50 * time.Millisecond}}
	for _, o := range opts {
		o(&cfg)
	}
	d, err := daemon.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.D = d
	srv := pki.ServerConfig(t, "localhost")
	srv.ClientAuth = tls.VerifyClientCertIfGiven
	l, addr := b.Listen(t, srv)
	w.Addr = addr
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := d.Serve(context.Background(), l); err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = d.Shutdown(ctx)
		<-served
	})
	return w
}

func sqliteAuth(t *testing.T) authority.Authority {
	t.Helper()
	a, err := authority.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

// createToken stores a fresh token valid for ttl and returns it.
func createToken(t *testing.T, auth authority.Authority, name string, ttl time.Duration) string {
	t.Helper()
	tok, err := trust.NewEnrollmentToken()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := authority.IdentitiesOf(auth).CreateEnrollmentToken(context.Background(), authority.EnrollmentToken{
		Hash: trust.HashEnrollmentToken(tok), ID: trust.EnrollmentTokenID(tok), Name: name, CreatedAt: now.Add(-time.Second), ExpiresAt: now.Add(ttl)}); err != nil {
		t.Fatal(err)
	}
	return tok
}

// recWrites records every byte the client writes on its streams.
type recWrites struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

type recConn struct {
	semantics.BackendConn
	w *recWrites
}

type recStream struct {
	semantics.RawStream
	w *recWrites
}

func (s recStream) Write(p []byte) (int, error) {
	s.w.mu.Lock()
	s.w.buf.Write(p)
	s.w.mu.Unlock()
	return s.RawStream.Write(p)
}

func (c recConn) OpenStream(ctx context.Context) (semantics.RawStream, error) {
	s, err := c.BackendConn.OpenStream(ctx)
	if err != nil {
		return nil, err
	}
	return recStream{s, c.w}, nil
}

type recWriteDialer struct {
	inner semantics.BackendDialer
	w     *recWrites
}

func (d recWriteDialer) Dial(ctx context.Context, addr string) (semantics.BackendConn, error) {
	c, err := d.inner.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	return recConn{c, d.w}, nil
}

func enroll(w *enginetest.World, tok string, dialer semantics.BackendDialer) (*agent.Enrollment, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if dialer == nil {
		dialer = w.B.Dialer(w.T, w.Pki.NoClientCertConfig(w.T, "localhost"))
	}
	return agent.Enroll(ctx, agent.EnrollRequest{Endpoint: agent.Endpoint{Address: w.Addr, Dialer: dialer, Backend: w.B.Name},
		Token: tok, RequestTimeout: 8 * time.Second})
}

// startEnrolled runs an agent on an enrolled identity with rotatable
// credentials stored in dir.
func startEnrolled(w *enginetest.World, en *agent.Enrollment, dir string, exec agent.Executor, opts ...enginetest.AgentOpt) (*agent.Agent, *trust.Credentials, chan error) {
	w.T.Helper()
	cf, kf := filepath.Join(dir, "agent.pem"), filepath.Join(dir, "agent-key.pem")
	if err := trust.WriteCredentialFiles(cf, kf, en.Chain, en.Key); err != nil {
		w.T.Fatal(err)
	}
	creds, err := trust.LoadCredentials(cf, kf)
	if err != nil {
		w.T.Fatal(err)
	}
	credFiles.Store(creds, [2]string{cf, kf})
	return startWithCreds(w, en.Runner, creds, exec, opts...)
}

func startWithCreds(w *enginetest.World, runner wire.RunnerId, creds *trust.Credentials, exec agent.Executor, opts ...enginetest.AgentOpt) (*agent.Agent, *trust.Credentials, chan error) {
	w.T.Helper()
	cli := creds.ClientConfigFor(w.Pki.NoClientCertConfig(w.T, "localhost"))
	a, _, runErr := w.StartAgent(enginetest.Identity{Runner: runner, Cert: *creds.Certificate()}, exec, append([]enginetest.AgentOpt{func(c *agent.Config) {
		c.Signer, c.CertChain, c.Credentials = nil, nil, creds
		c.Endpoints[0].Dialer = &enginetest.RecDialer{Inner: w.B.Dialer(w.T, cli)}
	}}, opts...)...)
	return a, creds, runErr
}

// TestEnrollment (§20): a one-time token over server-authenticated TLS
// yields a certificate bound to a fresh RunnerId for the agent's own key;
// the agent then registers with it; the request bytes hold no private key;
// the token cannot be used again.
func TestEnrollment(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		auth := sqliteAuth(t)
		w := newIDWorld(t, b, trusttest.NewPKI(t), auth)
		tok := createToken(t, auth, "build-7", time.Hour)
		rec := &recWrites{}
		en, err := enroll(w, tok, recWriteDialer{inner: b.Dialer(t, w.Pki.NoClientCertConfig(t, "localhost")), w: rec})
		if err != nil {
			t.Fatal(err)
		}
		if en.Runner == (wire.RunnerId{}) || en.Leaf.Subject.CommonName != "build-7" {
			t.Fatalf("enrollment %v %q", en.Runner, en.Leaf.Subject.CommonName)
		}
		if _, err := en.Leaf.Verify(x509.VerifyOptions{Roots: w.Pki.CAPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Fatalf("issued certificate: %v", err)
		}
		d, err := en.Key.(*ecdsa.PrivateKey).Bytes()
		if err != nil {
			t.Fatal(err)
		}
		rec.mu.Lock()
		sent := bytes.Clone(rec.buf.Bytes())
		rec.mu.Unlock()
		if len(sent) < 100 || bytes.Contains(sent, d) {
			t.Fatalf("request bytes (%d) hold the private key or were not recorded", len(sent))
		}
		if !bytes.Contains(sent, []byte(tok)) {
			t.Fatal("recorder did not see the request")
		}
		// The token is one-time.
		if _, err := enroll(w, tok, nil); err == nil || !strings.Contains(err.Error(), "already used") {
			t.Fatalf("second use: %v", err)
		}
		// The new identity registers.
		a, _, _ := startEnrolled(w, en, t.TempDir(), enginetest.NewCountingExec(false))
		if reg := w.AwaitRegistered(en.Runner); reg.Session != a.Session() {
			t.Fatalf("registration %+v", reg)
		}
		if st := w.D.IdentityStats(); st.Enrolled != 1 {
			t.Fatalf("stats %+v", st)
		}
		certs, err := authority.IdentitiesOf(auth).Certificates(context.Background(), en.Runner)
		if err != nil || len(certs) != 1 || certs[0].Serial != trust.SerialString(en.Leaf) {
			t.Fatalf("recorded certificates %+v, %v", certs, err)
		}
		if strings.Contains(w.LogBuf.String(), tok) {
			t.Fatal("the daemon logged the token")
		}
	})
}

// TestEnrollmentRefusals: unknown, expired and revoked tokens and bad
// requests get clear errors; an unauthenticated connection can do nothing
// but enroll.
func TestEnrollmentRefusals(t *testing.T) {
	auth := sqliteAuth(t)
	w := newIDWorld(t, enginetest.MemoryBackend(), trusttest.NewPKI(t), auth)
	unknown, _ := trust.NewEnrollmentToken()
	if _, err := enroll(w, unknown, nil); err == nil || !strings.Contains(err.Error(), "enrollment token unknown") {
		t.Fatalf("unknown token: %v", err)
	}
	exp := createToken(t, auth, "x", time.Millisecond)
	time.Sleep(5 * time.Millisecond) // let the 1 ms token expire (wall clock; no event exists)
	if _, err := enroll(w, exp, nil); err == nil || !strings.Contains(err.Error(), "enrollment token expired") {
		t.Fatalf("expired token: %v", err)
	}
	rev := createToken(t, auth, "y", time.Hour)
	if err := authority.IdentitiesOf(auth).RevokeEnrollmentToken(context.Background(), trust.EnrollmentTokenID(rev), time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := enroll(w, rev, nil); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("revoked token: %v", err)
	}
	// Raw unauthenticated connection: a bad CSR, then registration and a
	// heartbeat are refused.
	noCert := enginetest.Identity{Runner: wire.NewRunnerId()}
	rc := enginetest.RawOn(t, dialNoCert(t, w), noCert)
	rc.Hello(agentwire.RoleAgent)
	good := createToken(t, auth, "z", time.Hour)
	_, err := rc.Call(&agentwire.CertificateRequestV1{Token: good, CSR: []byte("not a csr")})
	var we *wire.WireErrorV1
	if !errors.As(err, &we) || we.Code != wire.ErrCodeInvalidValue {
		t.Fatalf("bad CSR: %v", err)
	}
	// The token survived the bad request (checked before consumption).
	if _, err := enroll(w, good, nil); err != nil {
		t.Fatalf("token after a bad CSR: %v", err)
	}
	rc2 := enginetest.RawOn(t, dialNoCert(t, w), noCert)
	rc2.Hello(agentwire.RoleAgent)
	if _, err := rc2.Call(&agentwire.HeartbeatV1{Runner: noCert.Runner, Session: wire.NewAgentSessionId(), Seq: 1}); !errors.As(err, &we) || we.Code != wire.ErrCodeNotRegistered {
		t.Fatalf("heartbeat without registration: %v", err)
	}
	key, _ := trust.GenerateKey()
	m := rc2.RegisterWith(wire.NewAgentSessionId(), noCert.Runner, key, nil)
	if rj, ok := m.(*agentwire.RegistrationRejectedV1); !ok || rj.Code != wire.ErrCodeForbidden {
		t.Fatalf("registration without a certificate: %#v", m)
	}
	if code := rc2.CloseCode(); code != wire.CloseAuthenticationFailure {
		t.Fatalf("close code %v", code)
	}
	// A renewal request before registration is refused.
	rc3 := enginetest.RawOn(t, dialNoCert(t, w), noCert)
	rc3.Hello(agentwire.RoleAgent)
	csr, _ := trust.CreateCSR(key, "x")
	if _, err := rc3.Call(&agentwire.CertificateRequestV1{CSR: csr}); !errors.As(err, &we) || we.Code != wire.ErrCodeNotRegistered {
		t.Fatalf("renewal before registration: %v", err)
	}
}

func dialNoCert(t *testing.T, w *enginetest.World) semantics.BackendConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	bc, err := w.B.Dialer(t, w.Pki.NoClientCertConfig(t, "localhost")).Dial(ctx, w.Addr)
	if err != nil {
		t.Fatal(err)
	}
	return bc
}

// TestEnrollmentTokenRaceTwoDaemons: concurrent enrollments with one token
// on two daemons sharing PostgreSQL: exactly one succeeds.
func TestEnrollmentTokenRaceTwoDaemons(t *testing.T) {
	dsn := pgtest.Shared(t).NewDatabase(t)
	open := func() authority.Authority {
		a, err := authority.OpenPostgres(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		return a
	}
	pki := trusttest.NewPKI(t)
	b := enginetest.QuicBackend()
	// Row-lock waits of the racing transactions under a loaded machine must
	// not hit the 500 ms authority deadline of fastTiming.
	slow := func(c *daemon.Config) {
		c.Timing.RequestTimeout, c.Timing.RegistrationTimeout = 5*time.Second, 10*time.Second
	}
	w1 := newIDWorld(t, b, pki, open(), slow, func(c *daemon.Config) { c.ID = "d1" })
	w2 := newIDWorld(t, b, pki, open(), slow, func(c *daemon.Config) { c.ID = "d2" })
	tok := createToken(t, w1.Auth, "race", time.Hour)
	const n = 6
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := w1
			if i%2 == 1 {
				w = w2
			}
			_, errs[i] = enroll(w, tok, nil)
		}()
	}
	wg.Wait()
	ok := 0
	for i, err := range errs {
		if err == nil {
			ok++
		} else if !strings.Contains(err.Error(), "already used") {
			t.Errorf("enrollment %d: %v", i, err)
		}
	}
	if ok != 1 {
		t.Fatalf("%d enrollments succeeded, want 1", ok)
	}
}

// TestRotationKeepsRunnerAndSession (§21, §300): the agent renews over its
// session, stores the new certificate and key, reconnects with them under
// the same RunnerId and AgentSessionId, and its in-flight attempt
// continues and completes exactly once.
func TestRotationKeepsRunnerAndSession(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		auth := sqliteAuth(t)
		// Heartbeat gaps under -race on 2 cores must not close the link
		// between the renewal and its answer.
		w := newIDWorld(t, b, trusttest.NewPKI(t), auth, func(c *daemon.Config) { c.Timing.HeartbeatInterval = time.Second })
		en, err := enroll(w, createToken(t, auth, "rot", time.Hour), nil)
		if err != nil {
			t.Fatal(err)
		}
		renewed := make(chan *x509.Certificate, 4)
		exec := enginetest.NewCountingExec(true)
		a, creds, _ := startEnrolled(w, en, t.TempDir(), exec, func(c *agent.Config) {
			c.Hooks.OnCertificateRenewed = func(c *x509.Certificate) { renewed <- c }
		})
		first := w.AwaitRegistered(en.Runner)
		w.AwaitActive(en.Runner)
		go func() { _, _ = w.D.OfferLease(context.Background(), en.Runner, enginetest.Offer(3)) }()
		job := enginetest.AwaitStart(t, exec)

		enginetest.AwaitConnected(t, a) // the offer may be served before the link is published
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := a.RenewCertificate(ctx); err != nil {
			t.Fatal(err)
		}
		var leaf *x509.Certificate
		select {
		case leaf = <-renewed:
		case <-time.After(5 * time.Second):
			t.Fatal("no renewal event")
		}
		if trust.SerialString(leaf) == trust.SerialString(en.Leaf) || !bytes.Equal(creds.Leaf().Raw, leaf.Raw) {
			t.Fatal("credentials not replaced")
		}
		if id, _ := trust.RunnerIDFromCert(leaf); id != en.Runner {
			t.Fatalf("renewed certificate names %v", id)
		}
		again := w.AwaitRegistered(en.Runner)
		if again.Session != first.Session || again.Session != a.Session() || again.Epoch <= first.Epoch {
			t.Fatalf("after rotation: %+v, before %+v", again, first)
		}
		// The files hold the new pair (a restart would use it).
		if reloaded, err := trust.LoadCredentials(filepathOf(t, creds)); err != nil || trust.SerialString(reloaded.Leaf()) != trust.SerialString(leaf) {
			t.Fatalf("files: %v", err)
		}
		w.AwaitActive(en.Runner)
		close(exec.Release)
		w.AwaitCompletion(job.Attempt, agentwire.AckAccepted)
		if n, _ := auth.Completions(context.Background(), job.Attempt); n != 1 || exec.Count(job.Attempt) != 1 {
			t.Fatalf("completions %d, runs %d", n, exec.Count(job.Attempt))
		}
		if st := w.D.IdentityStats(); st.Renewed != 1 {
			t.Fatalf("stats %+v", st)
		}
		if !strings.Contains(w.LogBuf.String(), `"event":"identity.renewed"`) {
			t.Fatal("no renewal audit record")
		}
		// Once the agent registered with the renewed certificate, the
		// old one is revoked (a stolen copy of the old key is useless):
		// an agent presenting it is refused.
		oldSerial := trust.SerialString(en.Leaf)
		deadline := time.Now().Add(5 * time.Second)
		for w.D.IdentityStats().Superseded == 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // retired on the connection's work goroutine after registration
		}
		certs, err := authority.IdentitiesOf(auth).Certificates(context.Background(), en.Runner)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range certs {
			if want := c.Serial == oldSerial; c.Revoked != want {
				t.Fatalf("certificate %s revoked=%v (old %s, new %s)", c.Serial, c.Revoked, oldSerial, trust.SerialString(leaf))
			}
		}
		_, _, oldErr := startEnrolled(w, en, t.TempDir(), enginetest.NewCountingExec(false))
		select {
		case err := <-oldErr:
			var re *agent.RejectedError
			if !errors.As(err, &re) || re.Code != wire.ErrCodeForbidden || !strings.Contains(re.Message, "revoked") {
				t.Fatalf("agent with the superseded certificate: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("an agent with the superseded certificate kept running")
		}
	})
}

// credFiles maps credentials written by startEnrolled to their files.
var credFiles sync.Map

// filepathOf returns the files of credentials started by startEnrolled.

func filepathOf(t *testing.T, c *trust.Credentials) (string, string) {
	t.Helper()
	v, ok := credFiles.Load(c)
	if !ok {
		t.Fatal("credentials not file-backed by startEnrolled")
	}
	p := v.([2]string)
	return p[0], p[1]
}

// TestAutomaticRenewal: a certificate reaching 2/3 of its lifetime is
// renewed without any call, before it expires.
func TestAutomaticRenewal(t *testing.T) {
	auth := sqliteAuth(t)
	// 1 s heartbeats: a heartbeat gap under -race must not be what cuts
	// the link this test watches.
	w := newIDWorld(t, enginetest.MemoryBackend(), trusttest.NewPKI(t), auth, func(c *daemon.Config) { c.Timing.HeartbeatInterval = time.Second })
	runner := wire.NewRunnerId()
	now := time.Now()
	short := w.Pki.IssueClient(t, runner, trusttest.LeafOptions{NotBefore: now.Add(-time.Second), NotAfter: now.Add(4 * time.Second)})
	creds, err := trust.NewCredentials(short)
	if err != nil {
		t.Fatal(err)
	}
	renewed := make(chan *x509.Certificate, 4)
	a, _, _ := startWithCreds(w, runner, creds, enginetest.NewCountingExec(false), func(c *agent.Config) {
		c.Hooks.OnCertificateRenewed = func(c *x509.Certificate) { renewed <- c }
	})
	first := w.AwaitRegistered(runner)
	select {
	case leaf := <-renewed:
		if !leaf.NotAfter.After(short.Leaf.NotAfter) {
			t.Fatal("renewed certificate does not outlive the old one")
		}
		if time.Now().After(short.Leaf.NotAfter) {
			t.Fatal("renewed only after expiry")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("certificate not renewed before expiry")
	}
	again := w.AwaitRegistered(runner)
	if again.Session != first.Session || again.Session != a.Session() {
		t.Fatal("session changed")
	}
	// Past the old certificate's expiry the agent is still connected.
	time.Sleep(time.Until(short.Leaf.NotAfter.Add(200 * time.Millisecond)))
	if s := enginetest.AwaitConnected(t, a); s.Transport != again.Transport {
		var closes []error
		for len(w.Ev.Disconnects) > 0 {
			closes = append(closes, <-w.Ev.Disconnects)
		}
		t.Fatalf("transport changed after the old certificate expired: %v vs %v (closes: %v)", s.Transport, again.Transport, closes)
	}
}

// TestExpiredCredentials (§22): an expired certificate fails the TLS
// handshake with a message explaining the expiry; a certificate expiring
// while connected closes the transport with AuthenticationFailure and an
// audit record.
func TestExpiredCredentials(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		auth := sqliteAuth(t)
		// Heartbeats every 2 s: the raw client below does not send any.
		w := newIDWorld(t, b, trusttest.NewPKI(t), auth, func(c *daemon.Config) { c.Timing.HeartbeatInterval = 2 * time.Second })
		runner := wire.NewRunnerId()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		bc, err := b.Dialer(t, w.Pki.ExpiredClientConfig(t, runner, "localhost")).Dial(ctx, w.Addr)
		if err == nil {
			// TLS 1.3: the client may learn of the rejection only after its
			// handshake returned; the connection then fails.
			select {
			case <-bc.Context().Done():
				err = context.Cause(bc.Context())
			case <-ctx.Done():
				t.Fatal("expired certificate accepted")
			}
		}
		if msg := trust.ExplainHandshakeError(err, nil, time.Now()); !strings.HasPrefix(msg, trust.MsgCredentialExpired) {
			t.Logf("%s: handshake error %q is not recognisably an expiry (the alert does not say so)", b.Name, msg)
			if !strings.Contains(msg, "certificate") {
				t.Fatalf("handshake error not about the certificate: %q", msg)
			}
		}
		// Expiry while connected.
		now := time.Now()
		id := enginetest.Identity{Runner: runner, Cert: w.Pki.IssueClient(t, runner, trusttest.LeafOptions{NotBefore: now.Add(-time.Minute), NotAfter: now.Add(1500 * time.Millisecond)})}
		rc := w.DialRaw(id)
		rc.Join(wire.NewAgentSessionId())
		if code := rc.CloseCode(); code != wire.CloseAuthenticationFailure {
			t.Fatalf("close code %v, want AuthenticationFailure", code)
		}
		if time.Now().Before(id.Cert.Leaf.NotAfter) {
			t.Fatal("closed before expiry")
		}
		if !hasAuditLine(w.LogBuf.String(), "auth.failure", `"reason":"certificate_expired"`, `"cert_serial":"`) {
			t.Fatalf("no auth.failure/certificate_expired audit record:\n%s", w.LogBuf.String())
		}
		if w.D.IdentityStats().ExpiredRejected < 1 {
			t.Fatal("expiry not counted")
		}
	})
}

// TestRevocationReachesEveryDaemon (§224–225): two daemons share
// PostgreSQL; a runner connected to daemon B is disabled through daemon A
// (and, separately, a certificate revoked through the authority): daemon
// B closes the live transport with RunnerDisabled (AuthenticationFailure)
// within the poll bound, and reconnects are refused.
func TestRevocationReachesEveryDaemon(t *testing.T) {
	for _, mk := range []func() enginetest.Backend{enginetest.QuicBackend, enginetest.YamuxBackend} {
		b := mk()
		t.Run(b.Name, func(t *testing.T) {
			dsn := pgtest.Shared(t).NewDatabase(t)
			open := func() authority.Authority {
				a, err := authority.OpenPostgres(context.Background(), dsn)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = a.Close() })
				return a
			}
			pki := trusttest.NewPKI(t)
			const poll = 100 * time.Millisecond
			pollOpt := func(c *daemon.Config) { c.Identity.RevocationPoll = poll }
			wa := newIDWorld(t, b, pki, open(), pollOpt, sharedDB, func(c *daemon.Config) { c.ID = "A" })
			wb := newIDWorld(t, b, pki, open(), pollOpt, sharedDB, func(c *daemon.Config) { c.ID = "B" })

			// Runner disabled through A; the agent is on B.
			id := wb.NewIdentity()
			rc := wb.DialRaw(id)
			rc.Join(wire.NewAgentSessionId())
			start := time.Now()
			if err := wa.D.DisableRunner(context.Background(), id.Runner, "decommissioned"); err != nil {
				t.Fatal(err)
			}
			if code := rc.CloseCode(); code != wire.CloseRunnerDisabled {
				t.Fatalf("close code %v, want RunnerDisabled", code)
			}
			took := time.Since(start)
			t.Logf("runner disable reached the other daemon in %v (poll %v)", took, poll)
			if took > poll+2*time.Second {
				t.Fatalf("revocation took %v", took)
			}
			rc2 := wb.DialRaw(id)
			rc2.Hello(agentwire.RoleAgent)
			if rj, ok := rc2.Register(wire.NewAgentSessionId()).(*agentwire.RegistrationRejectedV1); !ok || rj.Code != wire.ErrCodeRunnerDisabled ||
				!strings.Contains(rj.Message, "runner disabled") {
				t.Fatalf("reconnect of a disabled runner: %#v", rj)
			}

			// Certificate revoked by serial; the runner stays enabled.
			id2 := wb.NewIdentity()
			serial := trust.SerialString(id2.Cert.Leaf)
			ids := authority.IdentitiesOf(wa.Auth)
			if err := ids.RecordCertificate(context.Background(), authority.IssuedCertificate{Serial: serial, Runner: id2.Runner,
				NotAfter: id2.Cert.Leaf.NotAfter, IssuedAt: time.Now()}); err != nil {
				t.Fatal(err)
			}
			rc3 := wb.DialRaw(id2)
			rc3.Join(wire.NewAgentSessionId())
			start = time.Now()
			if err := ids.RevokeCertificate(context.Background(), serial, "key leaked", time.Now()); err != nil {
				t.Fatal(err)
			}
			if code := rc3.CloseCode(); code != wire.CloseAuthenticationFailure {
				t.Fatalf("close code %v, want AuthenticationFailure", code)
			}
			t.Logf("certificate revocation reached the daemon in %v (poll %v)", time.Since(start), poll)
			rc4 := wa.DialRaw(id2)
			rc4.Hello(agentwire.RoleAgent)
			if rj, ok := rc4.Register(wire.NewAgentSessionId()).(*agentwire.RegistrationRejectedV1); !ok || rj.Message != trust.MsgCredentialRevoked {
				t.Fatalf("reconnect with a revoked certificate: %#v", rj)
			}
			if !hasAuditLine(wb.LogBuf.String(), "runner.revoked", `"code":"Forbidden"`, `"cert_serial":"`) ||
				!hasAuditLine(wb.LogBuf.String(), "runner.revoked", `"code":"RunnerDisabled"`) {
				t.Fatalf("missing runner.revoked audit records (revoked certificate, disabled runner):\n%s", wb.LogBuf.String())
			}
		})
	}
}

// TestRenewalNeedsProtocol12: CertificateRequestV1 is new in protocol 1.2
// (1.0 and 1.1 shipped without it, their vectors are frozen), so an agent
// whose session negotiated 1.1 does not send it: RenewCertificate fails
// with ErrRenewalUnsupported and the daemon sees no request.
func TestRenewalNeedsProtocol12(t *testing.T) {
	auth := sqliteAuth(t)
	w := newIDWorld(t, enginetest.MemoryBackend(), trusttest.NewPKI(t), auth)
	en, err := enroll(w, createToken(t, auth, "old", time.Hour), nil)
	if err != nil {
		t.Fatal(err)
	}
	a, _, _ := startEnrolled(w, en, t.TempDir(), enginetest.NewCountingExec(false), func(c *agent.Config) {
		c.Protocol = wire.ProtocolRange{Min: wire.V(1, 0), Max: wire.V(1, 1)}
	})
	if s := w.AwaitRegistered(en.Runner); s.Protocol != wire.V(1, 1) {
		t.Fatalf("negotiated %v, want 1.1", s.Protocol)
	}
	enginetest.AwaitConnected(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.RenewCertificate(ctx); !errors.Is(err, agent.ErrRenewalUnsupported) {
		t.Fatalf("RenewCertificate at 1.1: %v, want ErrRenewalUnsupported", err)
	}
	if st := w.D.IdentityStats(); st.Renewed != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// hasAuditLine reports whether a JSON log line carries audit event and
// every one of attrs.
func hasAuditLine(log, event string, attrs ...string) bool {
next:
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, `"event":"`+event+`"`) {
			continue
		}
		for _, a := range attrs {
			if !strings.Contains(line, a) {
				continue next
			}
		}
		return true
	}
	return false
}
