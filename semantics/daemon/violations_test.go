package daemon_test

import (
	"context"
	"strings"
	"testing"
	"time"

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
	backends(t, func(t *testing.T, b backend) {
		w := newWorld(t, b)
		rc := w.dialRaw(w.newIdentity())
		renew := &agentwire.LeaseRenewV1{Lease: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId()}
		_, err := rc.call(renew)
		wantWireErr(t, err, wire.ErrCodeNotRegistered)
		rc.hello(agentwire.RoleAgent)
		_, err = rc.call(&agentwire.LeaseAcceptedV1{Lease: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId(), Session: wire.NewAgentSessionId()})
		wantWireErr(t, err, wire.ErrCodeNotRegistered)
		_, _ = rc.call(renew) // third violation
		if code := rc.closeCode(); code != wire.CloseProtocolError {
			t.Fatalf("closed with %s, want ProtocolError", code)
		}
		if w.d.Stats().ProtocolErrors < 3 {
			t.Fatalf("protocol errors %d", w.d.Stats().ProtocolErrors)
		}
	})
}

// TestDuplicateSessionFenced: a second transport registering the same agent
// session fences the first: T1 gets SessionFencedV1 and is closed with
// CloseSessionFenced; its late messages are rejected and audited.
func TestDuplicateSessionFenced(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		w := newWorld(t, b, slowHeartbeat)
		id := w.newIdentity()
		sess := wire.NewAgentSessionId()
		t1 := w.dialRaw(id)
		t1.join(sess)
		t2 := w.dialRaw(id)
		t2.join(sess)
		if t2.epoch != t1.epoch+1 {
			t.Fatalf("epochs %d then %d", t1.epoch, t2.epoch)
		}
		f, _ := next[*agentwire.SessionFencedV1](t, t1)
		if f.HolderTransport != t2.ack.TransportSession || f.FencedTransport != t1.ack.TransportSession || f.HolderEpoch != t2.epoch {
			t.Fatalf("fence %+v", f)
		}
		// A late message from T1 is rejected (or finds the transport closed).
		if _, err := t1.call(&agentwire.LeaseRenewV1{Lease: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId()}); err == nil {
			t.Fatal("late message from fenced transport was answered normally")
		} else if _, ok := err.(*wire.WireErrorV1); ok {
			wantWireErr(t, err, wire.ErrCodeSessionFenced)
			if !strings.Contains(w.logBuf.String(), `"event":"transport.cloned_identity"`) {
				t.Fatal("no cloned_identity audit record")
			}
		}
		if code := t1.closeCode(); code != wire.CloseSessionFenced {
			t.Fatalf("T1 closed with %s", code)
		}
		// T2 still works.
		env, err := t2.call(&agentwire.HeartbeatV1{Runner: id.runner, Session: sess, Seq: 1, CapabilityDigest: wire.CapabilityDigest{Digest: wire.Digest{9}}})
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
	backends(t, func(t *testing.T, b backend) {
		w := newWorld(t, b, func(c *daemon.Config) { c.Timing.RequestTimeout = 5 * time.Second }, slowHeartbeat)
		id := w.newIdentity()
		sess := wire.NewAgentSessionId()
		t1 := w.dialRaw(id)
		t1.join(sess)
		t2 := w.dialRaw(id)
		t2.join(sess)
		next[*agentwire.SessionFencedV1](t, t1)
		_, err := t1.call(&agentwire.PhaseChangeV1{Attempt: wire.NewJobAttemptId(), Lease: wire.NewLeaseId(), Phase: agentwire.PhaseRunning, AtMs: 1})
		wantWireErr(t, err, wire.ErrCodeSessionFenced)
		if code := t1.closeCode(); code != wire.CloseSessionFenced {
			t.Fatalf("T1 closed with %s", code)
		}
		log := w.logBuf.String()
		for _, want := range []string{`"event":"transport.cloned_identity"`, id.runner.String(), sess.String(),
			t1.ack.TransportSession.String(), t2.ack.TransportSession.String()} {
			if !strings.Contains(log, want) {
				t.Fatalf("audit record lacks %s:\n%s", want, log)
			}
		}
		if w.d.Stats().ClonedIdentity != 1 {
			t.Fatalf("ClonedIdentity = %d", w.d.Stats().ClonedIdentity)
		}
	})
}

// TestHeartbeatSeqDuplicatesDropped: heartbeats with seq ≤ the last seen
// are dropped without an ack.
func TestHeartbeatSeqDuplicatesDropped(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		w := newWorld(t, b, slowHeartbeat)
		id := w.newIdentity()
		sess := wire.NewAgentSessionId()
		rc := w.dialRaw(id)
		rc.join(sess)
		hb := func(seq uint64) error {
			_, err := rc.ch.Call(context.Background(), controlOut(&agentwire.HeartbeatV1{Runner: id.runner, Session: sess, Seq: seq,
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
		if got := w.d.Stats().HeartbeatsDropped; got != 3 {
			t.Fatalf("dropped %d, want 3", got)
		}
	})
}

// TestRegistrationTimeout: a transport that does not register in time is
// closed with CloseRegistrationTimeout (§60).
func TestRegistrationTimeout(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		w := newWorld(t, b, func(c *daemon.Config) { c.Timing.RegistrationTimeout = 150 * time.Millisecond })
		rc := w.dialRaw(w.newIdentity())
		rc.hello(agentwire.RoleAgent)
		start := time.Now()
		if code := rc.closeCode(); code != wire.CloseRegistrationTimeout {
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
	backends(t, func(t *testing.T, b backend) {
		w := newWorld(t, b)
		rc := w.dialRaw(w.newIdentity())
		rc.join(wire.NewAgentSessionId())
		if code := rc.closeCode(); code != wire.CloseIdleTimeout {
			t.Fatalf("closed with %s", code)
		}
	})
}

// TestSigningWorkerRejectsExecutionMessages: a signing worker registers
// but every execution message is RoleForbidden and never acted on.
func TestSigningWorkerRejectsExecutionMessages(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		w := newWorld(t, b)
		id := w.newIdentity()
		rc := w.dialRaw(id)
		rc.hello(agentwire.RoleSigningWorker)
		sess := wire.NewAgentSessionId()
		if _, ok := rc.register(sess).(*agentwire.RegistrationAcceptedV1); !ok {
			t.Fatal("signing worker registration refused")
		}
		for _, m := range []wire.Message{
			&agentwire.LeaseRenewV1{Lease: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId()},
			&agentwire.AgentResyncV1{Session: sess, Epoch: rc.epoch, CapabilityDigest: wire.CapabilityDigest{Digest: wire.Digest{9}}},
		} {
			_, err := rc.call(m)
			wantWireErr(t, err, wire.ErrCodeRoleForbidden)
		}
		if _, err := w.d.OfferLease(context.Background(), id.runner, offer(1)); err != daemon.ErrRoleForbidden {
			t.Fatalf("OfferLease to a signing worker: %v", err)
		}
		if st := w.d.Stats(); st.Renewals != 0 || st.Resyncs != 0 {
			t.Fatalf("forbidden messages were acted on: %+v", st)
		}
	})
}

// TestOldAgentSessionReplayRejected: once a runner registered a new agent
// session, registering the old one again is refused (StaleSession).
func TestOldAgentSessionReplayRejected(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		w := newWorld(t, b)
		id := w.newIdentity()
		old := wire.NewAgentSessionId()
		t1 := w.dialRaw(id)
		t1.join(old)
		t2 := w.dialRaw(id)
		t2.join(wire.NewAgentSessionId())
		t3 := w.dialRaw(id)
		t3.hello(agentwire.RoleAgent)
		rej, ok := t3.register(old).(*agentwire.RegistrationRejectedV1)
		if !ok || rej.Code != wire.ErrCodeStaleSession {
			t.Fatalf("replayed old session answered %+v", rej)
		}
	})
}

// TestOldLeaseReplayRejected: after an attempt completed, a replayed
// completion (new MessageId) is StaleRejected and a replayed renewal says
// Revoked/Unknown; the authority still holds exactly one completion.
func TestOldLeaseReplayRejected(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		w := newWorld(t, b)
		id := w.newIdentity()
		sess := wire.NewAgentSessionId()
		rc := w.dialRaw(id)
		rc.join(sess)
		done := make(chan authority.Lease, 1)
		go func() {
			l, _ := w.d.OfferLease(context.Background(), id.runner, offer(7))
			done <- l
		}()
		o, env := next[*agentwire.LeaseOfferV1](t, rc)
		if err := rc.ch.Reply(env, &agentwire.LeaseAcceptedV1{Lease: o.Lease, Attempt: o.Attempt, Session: sess}); err != nil {
			t.Fatal(err)
		}
		<-done
		compl := &agentwire.AttemptCompletionV1{Job: o.Job, Attempt: o.Attempt, Lease: o.Lease, Spec: o.SpecID,
			Result: agentwire.ExecutionResultV1{Kind: agentwire.ResultSucceeded}}
		for i, want := range []agentwire.CompletionAckKind{agentwire.AckAccepted, agentwire.AckStaleRejected} {
			env, err := rc.call(compl) // a fresh MessageId each time: a replay, not a retry
			if err != nil {
				t.Fatal(err)
			}
			if ack := env.Payload.(*agentwire.CompletionAckV1); ack.Kind != want {
				t.Fatalf("completion %d answered %s, want %s", i, ack.Kind, want)
			}
		}
		env, err := rc.call(&agentwire.LeaseRenewV1{Lease: o.Lease, Attempt: o.Attempt})
		if err != nil {
			t.Fatal(err)
		}
		if k := env.Payload.(*agentwire.LeaseRenewAckV1).Outcome.Kind; k == agentwire.RenewExtended {
			t.Fatal("renewal of a completed lease extended it")
		}
		if n, _ := w.auth.Completions(context.Background(), o.Attempt); n != 1 {
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
