package agent_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// TestRotationKeepsRunnerAndSession (§21, §300): the agent renews over its
// session, stores the new certificate and key, reconnects with them under
// the same RunnerId and AgentSessionId, and its in-flight attempt
// continues and completes exactly once.
func TestRotationKeepsRunnerAndSession(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		auth := enginetest.SqliteAuth(t)
		// Heartbeat gaps under -race on 2 cores must not close the link
		// between the renewal and its answer.
		w := enginetest.NewIDWorld(t, b, trusttest.NewPKI(t), auth, func(c *daemon.Config) { c.Timing.HeartbeatInterval = time.Second })
		en, err := enginetest.Enroll(w, enginetest.CreateToken(t, auth, "rot", time.Hour), nil)
		if err != nil {
			t.Fatal(err)
		}
		renewed := make(chan *x509.Certificate, 4)
		exec := enginetest.NewCountingExec(true)
		a, creds, _ := enginetest.StartEnrolled(w, en, t.TempDir(), exec, func(c *agent.Config) {
			c.Hooks.OnCertificateRenewed = func(c *x509.Certificate) { renewed <- c }
			// The renewal is a signature and a commit on the daemon: over
			// the harness's 500 ms on a loaded machine (seen under -race
			// with other packages' tests), within RenewCertificate's 5 s.
			c.RequestTimeout = 5 * time.Second
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
		if reloaded, err := trust.LoadCredentials(enginetest.FilepathOf(t, creds)); err != nil || trust.SerialString(reloaded.Leaf()) != trust.SerialString(leaf) {
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
		_, _, oldErr := enginetest.StartEnrolled(w, en, t.TempDir(), enginetest.NewCountingExec(false))
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

// TestAutomaticRenewal: a certificate reaching 2/3 of its lifetime is
// renewed without any call, before it expires.
func TestAutomaticRenewal(t *testing.T) {
	auth := enginetest.SqliteAuth(t)
	// 1 s heartbeats: a heartbeat gap under -race must not be what cuts
	// the link this test watches.
	w := enginetest.NewIDWorld(t, enginetest.MemoryBackend(), trusttest.NewPKI(t), auth, func(c *daemon.Config) { c.Timing.HeartbeatInterval = time.Second })
	runner := wire.NewRunnerId()
	now := time.Now()
	short := w.Pki.IssueClient(t, runner, trusttest.LeafOptions{NotBefore: now.Add(-time.Second), NotAfter: now.Add(4 * time.Second)})
	creds, err := trust.NewCredentials(short)
	if err != nil {
		t.Fatal(err)
	}
	renewed := make(chan *x509.Certificate, 4)
	a, _, _ := enginetest.StartWithCreds(w, runner, creds, enginetest.NewCountingExec(false), func(c *agent.Config) {
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

// TestRenewalNeedsProtocol12: CertificateRequestV1 is new in protocol 1.2
// (1.0 and 1.1 shipped without it, their vectors are frozen), so an agent
// whose session negotiated 1.1 does not send it: RenewCertificate fails
// with ErrRenewalUnsupported and the daemon sees no request.
func TestRenewalNeedsProtocol12(t *testing.T) {
	auth := enginetest.SqliteAuth(t)
	w := enginetest.NewIDWorld(t, enginetest.MemoryBackend(), trusttest.NewPKI(t), auth)
	en, err := enginetest.Enroll(w, enginetest.CreateToken(t, auth, "old", time.Hour), nil)
	if err != nil {
		t.Fatal(err)
	}
	a, _, _ := enginetest.StartEnrolled(w, en, t.TempDir(), enginetest.NewCountingExec(false), func(c *agent.Config) {
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
