package daemon_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

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

// TestEnrollment (§20): a one-time token over server-authenticated TLS
// yields a certificate bound to a fresh RunnerId for the agent's own key;
// the agent then registers with it; the request bytes hold no private key;
// the token cannot be used again.
func TestEnrollment(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		auth := enginetest.SqliteAuth(t)
		w := enginetest.NewIDWorld(t, b, trusttest.NewPKI(t), auth)
		tok := enginetest.CreateToken(t, auth, "build-7", time.Hour)
		rec := &recWrites{}
		en, err := enginetest.Enroll(w, tok, recWriteDialer{inner: b.Dialer(t, w.Pki.NoClientCertConfig(t, "localhost")), w: rec})
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
		if _, err := enginetest.Enroll(w, tok, nil); err == nil || !strings.Contains(err.Error(), "already used") {
			t.Fatalf("second use: %v", err)
		}
		// The new identity registers.
		a, _, _ := enginetest.StartEnrolled(w, en, t.TempDir(), enginetest.NewCountingExec(false))
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
	auth := enginetest.SqliteAuth(t)
	w := enginetest.NewIDWorld(t, enginetest.MemoryBackend(), trusttest.NewPKI(t), auth)
	unknown, _ := trust.NewEnrollmentToken()
	if _, err := enginetest.Enroll(w, unknown, nil); err == nil || !strings.Contains(err.Error(), "enrollment token unknown") {
		t.Fatalf("unknown token: %v", err)
	}
	exp := enginetest.CreateToken(t, auth, "x", time.Millisecond)
	time.Sleep(5 * time.Millisecond) // let the 1 ms token expire (wall clock; no event exists)
	if _, err := enginetest.Enroll(w, exp, nil); err == nil || !strings.Contains(err.Error(), "enrollment token expired") {
		t.Fatalf("expired token: %v", err)
	}
	rev := enginetest.CreateToken(t, auth, "y", time.Hour)
	if err := authority.IdentitiesOf(auth).RevokeEnrollmentToken(context.Background(), trust.EnrollmentTokenID(rev), time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := enginetest.Enroll(w, rev, nil); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("revoked token: %v", err)
	}
	// Raw unauthenticated connection: a bad CSR, then registration and a
	// heartbeat are refused.
	noCert := enginetest.Identity{Runner: wire.NewRunnerId()}
	rc := enginetest.RawOn(t, dialNoCert(t, w), noCert)
	rc.Hello(agentwire.RoleAgent)
	good := enginetest.CreateToken(t, auth, "z", time.Hour)
	_, err := rc.Call(&agentwire.CertificateRequestV1{Token: good, CSR: []byte("not a csr")})
	var we *wire.WireErrorV1
	if !errors.As(err, &we) || we.Code != wire.ErrCodeInvalidValue {
		t.Fatalf("bad CSR: %v", err)
	}
	// The token survived the bad request (checked before consumption).
	if _, err := enginetest.Enroll(w, good, nil); err != nil {
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
	w1 := enginetest.NewIDWorld(t, b, pki, open(), slow, func(c *daemon.Config) { c.ID = "d1" })
	w2 := enginetest.NewIDWorld(t, b, pki, open(), slow, func(c *daemon.Config) { c.ID = "d2" })
	tok := enginetest.CreateToken(t, w1.Auth, "race", time.Hour)
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
			_, errs[i] = enginetest.Enroll(w, tok, nil)
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

// TestExpiredCredentials (§22): an expired certificate fails the TLS
// handshake with a message explaining the expiry; a certificate expiring
// while connected closes the transport with AuthenticationFailure and an
// audit record.
func TestExpiredCredentials(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		auth := enginetest.SqliteAuth(t)
		// Heartbeats every 2 s: the raw client below does not send any.
		w := enginetest.NewIDWorld(t, b, trusttest.NewPKI(t), auth, func(c *daemon.Config) { c.Timing.HeartbeatInterval = 2 * time.Second })
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
			wa := enginetest.NewIDWorld(t, b, pki, open(), pollOpt, sharedDB, func(c *daemon.Config) { c.ID = "A" })
			wb := enginetest.NewIDWorld(t, b, pki, open(), pollOpt, sharedDB, func(c *daemon.Config) { c.ID = "B" })

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
