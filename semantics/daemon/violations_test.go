package daemon_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

func wantWireErr(t *testing.T, err error, code wire.ProtocolErrorCode) {
	t.Helper()
	we, ok := err.(*wire.WireErrorV1)
	if !ok {
		t.Fatalf("got %v (%T), want WireErrorV1 %s", err, err, code)
	}
	if we.Code != code {
		t.Fatalf("got error code %s, want %s", we.Code, code)
	}
}

// TestRegistrationRequiredBeforeLeaseMessages: lease messages before
// registration get NotRegistered, and repeated violations close the
// connection with CloseProtocolError.
func TestRegistrationRequiredBeforeLeaseMessages(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		rc := w.DialRaw(w.NewIdentity())
		renew := &agentwire.LeaseRenewV1{Lease: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId()}
		_, err := rc.Call(renew)
		wantWireErr(t, err, wire.ErrCodeNotRegistered)
		rc.Hello(agentwire.RoleAgent)
		_, err = rc.Call(&agentwire.LeaseAcceptedV1{Lease: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId(), Session: wire.NewAgentSessionId()})
		wantWireErr(t, err, wire.ErrCodeNotRegistered)
		_, _ = rc.Call(renew) // third violation
		if code := rc.CloseCode(); code != wire.CloseProtocolError {
			t.Fatalf("closed with %s, want ProtocolError", code)
		}
		if w.D.Stats().ProtocolErrors < 3 {
			t.Fatalf("protocol errors %d", w.D.Stats().ProtocolErrors)
		}
	})
}

// TestDuplicateSessionFenced: a second transport registering the same agent
// session fences the first: T1 gets SessionFencedV1 and is closed with
// CloseSessionFenced; its late messages are rejected and audited.
func TestDuplicateSessionFenced(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b, slowHeartbeat)
		id := w.NewIdentity()
		sess := wire.NewAgentSessionId()
		t1 := w.DialRaw(id)
		t1.Join(sess)
		t2 := w.DialRaw(id)
		t2.Join(sess)
		if t2.Epoch != t1.Epoch+1 {
			t.Fatalf("epochs %d then %d", t1.Epoch, t2.Epoch)
		}
		f, _ := enginetest.Next[*agentwire.SessionFencedV1](t, t1)
		if f.HolderTransport != t2.Ack.TransportSession || f.FencedTransport != t1.Ack.TransportSession || f.HolderEpoch != t2.Epoch {
			t.Fatalf("fence %+v", f)
		}
		// A late message from T1 is rejected (or finds the transport closed).
		if _, err := t1.Call(&agentwire.LeaseRenewV1{Lease: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId()}); err == nil {
			t.Fatal("late message from fenced transport was answered normally")
		} else if _, ok := err.(*wire.WireErrorV1); ok {
			wantWireErr(t, err, wire.ErrCodeSessionFenced)
			if !strings.Contains(w.LogBuf.String(), `"event":"transport.cloned_identity"`) {
				t.Fatal("no cloned_identity audit record")
			}
		}
		if code := t1.CloseCode(); code != wire.CloseSessionFenced {
			t.Fatalf("T1 closed with %s", code)
		}
		// T2 still works.
		env, err := t2.Call(&agentwire.HeartbeatV1{Runner: id.Runner, Session: sess, Seq: 1, CapabilityDigest: wire.CapabilityDigest{Digest: wire.Digest{9}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := env.Payload.(*agentwire.HeartbeatAckV1); !ok {
			t.Fatalf("T2 heartbeat answered with %T", env.Payload)
		}
	})
}

// TestClonedIdentityAudit: a fenced transport that keeps talking inside the
// close grace is audited (runner, session, both transports; no payload).
func TestClonedIdentityAudit(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b, func(c *daemon.Config) { c.Timing.RequestTimeout = 5 * time.Second }, slowHeartbeat)
		id := w.NewIdentity()
		sess := wire.NewAgentSessionId()
		t1 := w.DialRaw(id)
		t1.Join(sess)
		t2 := w.DialRaw(id)
		t2.Join(sess)
		enginetest.Next[*agentwire.SessionFencedV1](t, t1)
		_, err := t1.Call(&agentwire.PhaseChangeV1{Attempt: wire.NewJobAttemptId(), Lease: wire.NewLeaseId(), Phase: agentwire.PhaseRunning, AtMs: 1})
		wantWireErr(t, err, wire.ErrCodeSessionFenced)
		if code := t1.CloseCode(); code != wire.CloseSessionFenced {
			t.Fatalf("T1 closed with %s", code)
		}
		log := w.LogBuf.String()
		for _, want := range []string{`"event":"transport.cloned_identity"`, id.Runner.String(), sess.String(),
			t1.Ack.TransportSession.String(), t2.Ack.TransportSession.String()} {
			if !strings.Contains(log, want) {
				t.Fatalf("audit record lacks %s:\n%s", want, log)
			}
		}
		if w.D.Stats().ClonedIdentity != 1 {
			t.Fatalf("ClonedIdentity = %d", w.D.Stats().ClonedIdentity)
		}
	})
}

// TestHeartbeatSeqDuplicatesDropped: heartbeats with seq ≤ the last seen
// are dropped without an ack.
func TestHeartbeatSeqDuplicatesDropped(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b, slowHeartbeat)
		id := w.NewIdentity()
		sess := wire.NewAgentSessionId()
		rc := w.DialRaw(id)
		rc.Join(sess)
		hb := func(seq uint64) error {
			_, err := rc.Ch.Call(context.Background(), enginetest.ControlOut(&agentwire.HeartbeatV1{Runner: id.Runner, Session: sess, Seq: seq,
				CapabilityDigest: wire.CapabilityDigest{Digest: wire.Digest{9}}}), 150*time.Millisecond)
			return err
		}
		for _, c := range []struct {
			seq   uint64
			acked bool
		}{{1, true}, {2, true}, {2, false}, {1, false}, {5, true}, {4, false}} {
			err := hb(c.seq)
			if (err == nil) != c.acked {
				t.Fatalf("seq %d: err %v, want acked=%v", c.seq, err, c.acked)
			}
		}
		if got := w.D.Stats().HeartbeatsDropped; got != 3 {
			t.Fatalf("dropped %d, want 3", got)
		}
	})
}

// TestRegistrationTimeout: a transport that does not register in time is
// closed with CloseRegistrationTimeout (§60).
func TestRegistrationTimeout(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b, func(c *daemon.Config) { c.Timing.RegistrationTimeout = 150 * time.Millisecond })
		rc := w.DialRaw(w.NewIdentity())
		rc.Hello(agentwire.RoleAgent)
		start := time.Now()
		if code := rc.CloseCode(); code != wire.CloseRegistrationTimeout {
			t.Fatalf("closed with %s", code)
		}
		if el := time.Since(start); el > 3*time.Second {
			t.Fatalf("closed after %v", el)
		}
	})
}

// TestHeartbeatLivenessTimeout: no heartbeat for 3 intervals closes the
// transport with CloseIdleTimeout.
func TestHeartbeatLivenessTimeout(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		rc := w.DialRaw(w.NewIdentity())
		rc.Join(wire.NewAgentSessionId())
		if code := rc.CloseCode(); code != wire.CloseIdleTimeout {
			t.Fatalf("closed with %s", code)
		}
	})
}

// TestSigningWorkerRejectsExecutionMessages: a signing worker registers
// but every execution message is RoleForbidden and never acted on.
func TestSigningWorkerRejectsExecutionMessages(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		rc := w.DialRaw(id)
		rc.Hello(agentwire.RoleSigningWorker)
		sess := wire.NewAgentSessionId()
		if _, ok := rc.Register(sess).(*agentwire.RegistrationAcceptedV1); !ok {
			t.Fatal("signing worker registration refused")
		}
		for _, m := range []wire.Message{
			&agentwire.LeaseRenewV1{Lease: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId()},
			&agentwire.AgentResyncV1{Session: sess, Epoch: rc.Epoch, CapabilityDigest: wire.CapabilityDigest{Digest: wire.Digest{9}}},
		} {
			_, err := rc.Call(m)
			wantWireErr(t, err, wire.ErrCodeRoleForbidden)
		}
		if _, err := w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(1)); err != daemon.ErrRoleForbidden {
			t.Fatalf("OfferLease to a signing worker: %v", err)
		}
		if st := w.D.Stats(); st.Renewals != 0 || st.Resyncs != 0 {
			t.Fatalf("forbidden messages were acted on: %+v", st)
		}
	})
}

// TestOldAgentSessionReplayRejected: once a runner registered a new agent
// session, registering the old one again is refused (StaleSession).
func TestOldAgentSessionReplayRejected(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		old := wire.NewAgentSessionId()
		t1 := w.DialRaw(id)
		t1.Join(old)
		t2 := w.DialRaw(id)
		t2.Join(wire.NewAgentSessionId())
		t3 := w.DialRaw(id)
		t3.Hello(agentwire.RoleAgent)
		rej, ok := t3.Register(old).(*agentwire.RegistrationRejectedV1)
		if !ok || rej.Code != wire.ErrCodeStaleSession {
			t.Fatalf("replayed old session answered %+v", rej)
		}
	})
}

// TestOldLeaseReplayRejected: after an attempt completed, a replayed
// completion (new MessageId) is StaleRejected and a replayed renewal says
// Revoked/Unknown; the authority still holds exactly one completion.
func TestOldLeaseReplayRejected(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		sess := wire.NewAgentSessionId()
		rc := w.DialRaw(id)
		rc.Join(sess)
		done := make(chan authority.Lease, 1)
		go func() {
			l, _ := w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(7))
			done <- l
		}()
		o, env := enginetest.Next[*agentwire.LeaseOfferV1](t, rc)
		if err := rc.Ch.Reply(env, &agentwire.LeaseAcceptedV1{Lease: o.Lease, Attempt: o.Attempt, Session: sess}); err != nil {
			t.Fatal(err)
		}
		<-done
		compl := &agentwire.AttemptCompletionV1{Job: o.Job, Attempt: o.Attempt, Lease: o.Lease, Spec: o.SpecID,
			Result: agentwire.ExecutionResultV1{Kind: agentwire.ResultSucceeded}}
		for i, want := range []agentwire.CompletionAckKind{agentwire.AckAccepted, agentwire.AckStaleRejected} {
			env, err := rc.Call(compl) // a fresh MessageId each time: a replay, not a retry
			if err != nil {
				t.Fatal(err)
			}
			if ack := env.Payload.(*agentwire.CompletionAckV1); ack.Kind != want {
				t.Fatalf("completion %d answered %s, want %s", i, ack.Kind, want)
			}
		}
		env, err := rc.Call(&agentwire.LeaseRenewV1{Lease: o.Lease, Attempt: o.Attempt})
		if err != nil {
			t.Fatal(err)
		}
		if k := env.Payload.(*agentwire.LeaseRenewAckV1).Outcome.Kind; k == agentwire.RenewExtended {
			t.Fatal("renewal of a completed lease extended it")
		}
		if n, _ := w.Auth.Completions(context.Background(), o.Attempt); n != 1 {
			t.Fatalf("completions %d", n)
		}
	})
}

// slowHeartbeat keeps raw clients (which send no heartbeats) alive.
func slowHeartbeat(c *daemon.Config) { c.Timing.HeartbeatInterval = 10 * time.Second }

// sharedDB is for worlds on a shared PostgreSQL authority whose test
// checks which daemon an agent with several endpoints registers with. On
// a busy 2-core machine fastTiming is too tight there: its 500 ms
// authority timeout is exceeded by a loaded database, and its 300 ms
// heartbeat limit by a starved process; either failure sends the agent to
// its next endpoint, which is not what such a test checks.
func sharedDB(c *daemon.Config) {
	c.Timing.RequestTimeout = 5 * time.Second
	c.Timing.HeartbeatInterval = time.Second
}
