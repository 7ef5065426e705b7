package daemon_test

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/enginetest"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// TestDuplicateLeaseDeliverySafe: offers re-sent (same MessageId) before
// the answer arrives are answered with the same answer and never start a
// second execution.
func TestDuplicateLeaseDeliverySafe(t *testing.T) {
	n := memory.NewNetwork()
	b := enginetest.MemoryBackend()
	b.Dialer = func(t *testing.T, conf *tls.Config) semantics.BackendDialer {
		// 40 ms one way: the daemon re-sends the offer every 20 ms.
		return &memory.Dialer{Network: n, TLSConfig: conf, Options: memory.Options{Latency: 40 * time.Millisecond}}
	}
	b.Listen = enginetest.ListenOn(n)
	w := enginetest.NewWorld(t, b, func(c *daemon.Config) {
		c.Timing.RenewInterval = 20 * time.Millisecond
		c.Timing.RequestTimeout = 20 * time.Millisecond
		c.Timing.HeartbeatInterval = 200 * time.Millisecond
	})
	id := w.NewIdentity()
	exec := enginetest.NewCountingExec(true)
	a, _, _ := w.StartAgent(id, exec)
	w.AwaitActive(id.Runner)
	l, err := w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(3))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for w.D.Stats().DuplicateAnswers == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // duplicates in flight arrive after the first answer
	}
	close(exec.Release)
	w.AwaitCompletion(l.Attempt, agentwire.AckAccepted)
	if c := exec.Count(l.Attempt); c != 1 {
		t.Fatalf("executor ran %d times", c)
	}
	if a.Stats().DuplicatesAbsorbed == 0 || w.D.Stats().OfferResends == 0 {
		t.Fatalf("no duplicate offer was delivered (agent %+v, daemon resends %d)", a.Stats(), w.D.Stats().OfferResends)
	}
	if w.D.Stats().DuplicateAnswers == 0 {
		t.Fatal("daemon saw no duplicate answer")
	}
}

// TestCompletionRetryAfterLostAck: the connection dies after the daemon
// committed a completion and before the ack reaches the agent; the agent
// retries with the same MessageId on the next transport and gets
// DuplicateAccepted; the authority holds exactly one completion.
func TestCompletionRetryAfterLostAck(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		done := make(chan agent.AttemptDone, 1)
		_, rd, _ := w.StartAgent(id, enginetest.NewCountingExec(false), func(c *agent.Config) {
			c.Hooks.OnAttemptDone = func(d agent.AttemptDone) { done <- d }
		})
		w.AwaitActive(id.Runner)
		cutOnce := func(ev daemon.CompletionEvent) {
			if ev.Ack == agentwire.AckAccepted {
				rd.Cut() // before the ack is written
			}
		}
		w.Ev.OnComplete.Store(&cutOnce)
		l, err := w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(4))
		if err != nil {
			t.Fatal(err)
		}
		first := w.AwaitCompletion(l.Attempt, agentwire.AckAccepted)
		w.Ev.OnComplete.Store(nil)
		second := w.AwaitCompletion(l.Attempt, agentwire.AckDuplicateAccepted)
		if first.MessageID != second.MessageID {
			t.Fatal("retry used a new MessageId")
		}
		if first.Transport == second.Transport {
			t.Fatal("retry arrived on the same transport")
		}
		select {
		case d := <-done:
			if d.Ack != agentwire.AckDuplicateAccepted || d.Retries < 1 {
				t.Fatalf("agent saw %+v", d)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("agent never saw the ack")
		}
		if n, _ := w.Auth.Completions(context.Background(), l.Attempt); n != 1 {
			t.Fatalf("completions %d", n)
		}
	})
}

// TestSameSessionKeepsAuthorityAcrossReconnect: an attempt keeps running
// across a transport reconnect under the same AgentSessionId (new
// transport, epoch+1) and its completion is accepted.
func TestSameSessionKeepsAuthorityAcrossReconnect(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		exec := enginetest.NewCountingExec(true)
		a, rd, _ := w.StartAgent(id, exec)
		w.AwaitActive(id.Runner)
		first := enginetest.AwaitConnected(t, a)
		go func() { _, _ = w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(5)) }()
		job := enginetest.AwaitStart(t, exec)
		rd.Cut()
		reg := w.AwaitRegistered(id.Runner) // first registration
		if reg.Epoch == 1 {
			reg = w.AwaitRegistered(id.Runner)
		}
		if reg.Session != a.Session() || reg.Epoch < 2 || reg.Transport == first.Transport {
			t.Fatalf("re-registration %+v", reg)
		}
		w.AwaitActive(id.Runner)
		close(exec.Release)
		w.AwaitCompletion(job.Attempt, agentwire.AckAccepted)
		if exec.Count(job.Attempt) != 1 {
			t.Fatal("attempt restarted after reconnect")
		}
		if w.D.Stats().Reconnects < 1 || a.Stats().Resyncs < 2 {
			t.Fatalf("daemon %+v agent %+v", w.D.Stats(), a.Stats())
		}
	})
}

// TestNewSessionDoesNotInherit: a new agent process (new AgentSessionId)
// of the same runner supersedes the old session: the old attempt's lease
// is revoked, its completion is stale, and the old session can no longer
// register.
func TestNewSessionDoesNotInherit(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		exec := enginetest.NewCountingExec(true)
		done := make(chan agent.AttemptDone, 1)
		_, _, run1 := w.StartAgent(id, exec, func(c *agent.Config) {
			c.Hooks.OnAttemptDone = func(d agent.AttemptDone) { done <- d }
		})
		w.AwaitActive(id.Runner)
		go func() { _, _ = w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(6)) }()
		job := enginetest.AwaitStart(t, exec)
		a2, _, _ := w.StartAgent(id, enginetest.NewCountingExec(false))
		enginetest.AwaitConnected(t, a2)
		// The old agent loses its transport, cannot re-register its session,
		// and its attempt is cancelled/stale.
		select {
		case err := <-run1:
			var re *agent.RejectedError
			if !errors.As(err, &re) || re.Code != wire.ErrCodeStaleSession {
				t.Fatalf("old agent Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("old agent kept running")
		}
		l, err := w.Auth.Lease(context.Background(), job.Lease)
		if err != nil {
			t.Fatal(err)
		}
		if l.State.Live() {
			t.Fatalf("old session's lease still %s", l.State)
		}
		if n, _ := w.Auth.Completions(context.Background(), job.Attempt); n != 0 {
			t.Fatal("old attempt completed")
		}
	})
}

// TestDisabledRunnerClosed: DisableRunner closes the runner's transport
// with CloseRunnerDisabled and the agent stops with RunnerDisabled.
func TestDisabledRunnerClosed(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		_, _, runErr := w.StartAgent(id, enginetest.NewCountingExec(false))
		w.AwaitActive(id.Runner)
		if err := w.D.DisableRunner(context.Background(), id.Runner, "compromised"); err != nil {
			t.Fatal(err)
		}
		// The agent re-dials once and is refused at registration; that
		// second transport's end (closed by the agent) may be reported
		// before the first one's, so look for the RunnerDisabled close
		// among the first two.
		timeout := time.After(10 * time.Second)
		var ends []error
	wait:
		for len(ends) < 2 {
			select {
			case err := <-w.Ev.Disconnects:
				ends = append(ends, err)
				var ce *semantics.ConnError
				if errors.As(err, &ce) && ce.Code == wire.CloseRunnerDisabled {
					break wait
				}
			case <-timeout:
				t.Fatalf("transport not closed with RunnerDisabled; ends seen: %v", ends)
			}
		}
		if last := ends[len(ends)-1]; !isClose(last, wire.CloseRunnerDisabled) {
			t.Fatalf("transports ended with %v, none with RunnerDisabled", ends)
		}
		select {
		case err := <-runErr:
			var re *agent.RejectedError
			if !errors.As(err, &re) || re.Code != wire.ErrCodeRunnerDisabled {
				t.Fatalf("agent Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("agent kept running")
		}
		deadline := time.Now().Add(5 * time.Second)
		for len(w.D.Sessions()) != 0 && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond) // the rejected re-dial is torn down asynchronously
		}
		if len(w.D.Sessions()) != 0 {
			t.Fatalf("sessions left: %+v", w.D.Sessions())
		}
	})
}

// TestLeaseGraceProbeSavesLease: a lease whose renewals come too late
// (TTL shorter than the renew interval) expires, is probed, and the
// agent's immediate renewal saves it: the attempt completes, nothing is
// revoked.
func TestLeaseGraceProbeSavesLease(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b, func(c *daemon.Config) {
			c.Timing.RenewInterval = 100 * time.Millisecond
			c.Timing.RevokeGrace = 300 * time.Millisecond
		})
		id := w.NewIdentity()
		exec := enginetest.NewCountingExec(true)
		w.StartAgent(id, exec)
		w.AwaitActive(id.Runner)
		o := enginetest.Offer(8)
		o.TTL = 40 * time.Millisecond // expires between renewals
		go func() { _, _ = w.D.OfferLease(context.Background(), id.Runner, o) }()
		job := enginetest.AwaitStart(t, exec)
		deadline := time.Now().Add(10 * time.Second)
		for w.D.Stats().Probes < 3 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // no event for "probe answered"
		}
		if w.D.Stats().Probes < 3 {
			t.Fatalf("probes %d", w.D.Stats().Probes)
		}
		close(exec.Release)
		w.AwaitCompletion(job.Attempt, agentwire.AckAccepted)
		if st := w.D.Stats(); st.LeasesRevoked != 0 {
			t.Fatalf("revoked %d leases", st.LeasesRevoked)
		}
	})
}

// TestLeaseRevokedWithoutRenewals: with probes unanswered (the agent is
// gone) the lease is revoked after the grace.
func TestLeaseRevokedAfterGrace(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b, slowHeartbeat, func(c *daemon.Config) {
			c.Timing.RenewInterval = 30 * time.Millisecond
			c.Timing.RevokeGrace = 100 * time.Millisecond
		})
		id := w.NewIdentity()
		rc := w.DialRaw(id) // accepts, never renews, ignores probes
		sess := wire.NewAgentSessionId()
		rc.Join(sess)
		o := enginetest.Offer(9)
		o.TTL = 50 * time.Millisecond
		go func() { _, _ = w.D.OfferLease(context.Background(), id.Runner, o) }()
		lo, env := enginetest.Next[*agentwire.LeaseOfferV1](t, rc)
		_ = rc.Ch.Reply(env, &agentwire.LeaseAcceptedV1{Lease: lo.Lease, Attempt: lo.Attempt, Session: sess})
		enginetest.Next[*agentwire.LeaseProbeV1](t, rc)
		c, _ := enginetest.Next[*agentwire.CancelAttemptV1](t, rc)
		if c.Reason != agentwire.CancelLeaseRevoked || c.Lease != lo.Lease {
			t.Fatalf("cancel %+v", c)
		}
		l, _ := w.Auth.Lease(context.Background(), lo.Lease)
		if l.State.Live() {
			t.Fatalf("lease %s", l.State)
		}
	})
}

// TestCancelDelivery: CancelAttempt reaches the agent at cancel priority,
// the executor's context ends, the Cancelled completion is accepted. The
// delivery latency is measured.
func TestCancelDelivery(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		exec := enginetest.NewCountingExec(true)
		done := make(chan agent.AttemptDone, 1)
		w.StartAgent(id, exec, func(c *agent.Config) { c.Hooks.OnAttemptDone = func(d agent.AttemptDone) { done <- d } })
		w.AwaitActive(id.Runner)
		go func() { _, _ = w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(10)) }()
		job := enginetest.AwaitStart(t, exec)
		start := time.Now()
		if err := w.D.CancelAttempt(context.Background(), job.Attempt, agentwire.CancelUserRequested); err != nil {
			t.Fatal(err)
		}
		acked := time.Since(start)
		select {
		case d := <-done:
			if d.Result.Kind != agentwire.ResultCancelled || d.Ack != agentwire.AckAccepted {
				t.Fatalf("done %+v", d)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("cancelled attempt never completed")
		}
		lat := w.D.Stats().CancelDelivery
		if len(lat) != 1 {
			t.Fatalf("cancel latency samples %v", lat)
		}
		t.Logf("%s: cancel delivered and acknowledged in %v (daemon sample %v)", b.Name, acked, lat[0])
	})
}

// TestDrainAndResume: a drained runner gets no leases; resume restores.
func TestDrainAndResume(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		a, _, _ := w.StartAgent(id, enginetest.NewCountingExec(false))
		w.AwaitActive(id.Runner)
		ctx := context.Background()
		if err := w.D.DrainRunner(ctx, id.Runner, "maintenance"); err != nil {
			t.Fatal(err)
		}
		if _, err := w.D.OfferLease(ctx, id.Runner, enginetest.Offer(11)); !errors.Is(err, daemon.ErrDraining) {
			t.Fatalf("offer while draining: %v", err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for !a.Status().Draining && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
		if !a.Status().Draining {
			t.Fatal("agent not draining")
		}
		if err := w.D.ResumeRunner(ctx, id.Runner); err != nil {
			t.Fatal(err)
		}
		for a.Status().Draining && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
		l, err := w.D.OfferLease(ctx, id.Runner, enginetest.Offer(12))
		if err != nil {
			t.Fatal(err)
		}
		w.AwaitCompletion(l.Attempt, agentwire.AckAccepted)
	})
}

// fakeConn is one agent connection served by hand (a hand-made daemon).
type fakeConn struct {
	t   *testing.T
	ctx context.Context
	bc  semantics.BackendConn
	ch  *control.Channel
	in  chan *wire.Envelope
}

// acceptFake accepts the agent's next connection on l and runs hello,
// registration (epoch) and resync, answering the resync with decide (nil:
// no results).
func acceptFake(t *testing.T, l semantics.BackendListener, a *agent.Agent, epoch uint64,
	decide func(*agentwire.AgentResyncV1) *agentwire.ResyncResponseV1) *fakeConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	bc, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bc.CloseWithCode(wire.CloseNormal, "") })
	sc, _ := semantics.NewConn(bc, semantics.Config{})
	st, err := sc.AcceptStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeConn{t: t, ctx: ctx, bc: bc, ch: control.New(st, control.Config{}), in: make(chan *wire.Envelope, 64)}
	go func() { _ = f.ch.Run(func(e *wire.Envelope) { f.in <- e }, nil) }()
	tr := wire.NewTransportSessionId()
	_ = f.ch.Reply(f.recv(), &agentwire.HelloAckV1{Negotiated: wire.Current, ServerRange: wire.Supported, TransportSession: tr,
		ServerTimeMs: 1, Challenge: [32]byte{1}})
	_ = f.ch.Reply(f.recv(), &agentwire.RegistrationAcceptedV1{Session: a.Session(), Epoch: epoch, TransportSession: tr,
		HeartbeatIntervalMs: 10000, LeaseRenewIntervalMs: 10000, MaxBackoffMs: 20, ServerTimeMs: 1})
	rs := f.recv()
	resp := &agentwire.ResyncResponseV1{}
	if decide != nil {
		resp = decide(rs.Payload.(*agentwire.AgentResyncV1))
	}
	_ = f.ch.Reply(rs, resp)
	return f
}

// recv returns the next message that is not a heartbeat or phase change.
func (f *fakeConn) recv() *wire.Envelope {
	f.t.Helper()
	for {
		select {
		case e := <-f.in:
			switch m := e.Payload.(type) {
			case *agentwire.HeartbeatV1, *agentwire.PhaseChangeV1:
				continue
			case *wlogs.LogsFinalizedV1:
				// This fake keeps no logs: pass the barrier at once.
				_ = f.ch.Reply(e, &wlogs.LogsFinalizedAckV1{Attempt: m.Attempt, LastSeq: m.LastSeq})
				continue
			}
			return e
		case <-f.ctx.Done():
			f.t.Fatal("agent went silent")
			return nil
		}
	}
}

func fakeOffer(a *agent.Agent, i int) *agentwire.LeaseOfferV1 {
	return &agentwire.LeaseOfferV1{Lease: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId(), Job: wire.NewJobId(), SpecID: enginetest.Spec(i),
		ExpiresAtMs: uint64(time.Now().Add(time.Minute).UnixMilli()), TTLMs: 60000,
		PayloadRef: wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: wire.Digest{1}, Size: 1}, Session: a.Session(), Epoch: 1}
}

// TestAgentAnswersDuplicateOfferOnce drives a real agent with a hand-made
// daemon on every backend: the same offer (same MessageId) delivered three
// times gets three identical answers and one execution.
func TestAgentAnswersDuplicateOfferOnce(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		pki := trusttest.NewPKI(t)
		l, addr := b.Listen(t, pki.ServerConfig(t, "localhost"))
		w := &enginetest.World{T: t, B: b, Pki: pki, Addr: addr}
		id := w.NewIdentity()
		exec := enginetest.NewCountingExec(false)
		metrics := telemetry.NewMetrics()
		a, _, _ := w.StartAgent(id, exec, func(c *agent.Config) { c.Metrics = metrics })
		f := acceptFake(t, l, a, 1, nil)
		enginetest.AwaitConnected(t, a)
		o := fakeOffer(a, 1)
		id1 := wire.NewMessageId()
		for i := 0; i < 3; i++ {
			if _, err := f.ch.Send(control.Out{ID: id1, Msg: o}); err != nil {
				t.Fatal(err)
			}
		}
		// Three answers, then the one completion (the executor has run).
		for n, done := 0, false; n < 3 || !done; {
			e := f.recv()
			switch m := e.Payload.(type) {
			case *agentwire.LeaseAcceptedV1:
				if wire.MessageId(e.CorrelationID) != id1 || m.Lease != o.Lease {
					t.Fatalf("answer %+v correlates to %s", m, e.CorrelationID)
				}
				n++
			case *agentwire.LeaseRejectedV1:
				t.Fatalf("duplicate offer rejected: %+v", m)
			case *agentwire.AttemptCompletionV1:
				_ = f.ch.Reply(e, &agentwire.CompletionAckV1{Attempt: m.Attempt, Lease: m.Lease, Kind: agentwire.AckAccepted})
				done = true
			}
		}
		if exec.Count(o.Attempt) != 1 {
			t.Fatalf("executor ran %d times", exec.Count(o.Attempt))
		}
		if a.Stats().DuplicatesAbsorbed != 2 {
			t.Fatalf("duplicates absorbed %d", a.Stats().DuplicatesAbsorbed)
		}
		// The agent's messages_total counts the two re-deliveries as
		// duplicates (counted right after each answer is written).
		var dup float64
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			_, fams := scrapeFamilies(t, metrics)
			if dup = familyValue(fams, "forgeyard_transport_messages_total", "family", "agent", "outcome", "duplicate"); dup >= 2 {
				break
			}
		}
		if dup != 2 {
			t.Fatalf("agent messages_total{agent,duplicate} = %v, want 2", dup)
		}
	})
}

// TestAgentResyncDecisions: after a reconnect, Stale stops an attempt and
// discards it (no completion), Cancel stops it and reports Cancelled,
// Continue keeps it running.
func TestAgentResyncDecisions(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		pki := trusttest.NewPKI(t)
		l, addr := b.Listen(t, pki.ServerConfig(t, "localhost"))
		w := &enginetest.World{T: t, B: b, Pki: pki, Addr: addr}
		id := w.NewIdentity()
		exec := enginetest.NewCountingExec(true)
		cancels := make(chan wire.JobAttemptId, 8)
		a, _, _ := w.StartAgent(id, exec, func(c *agent.Config) {
			c.Hooks.OnCancel = func(att wire.JobAttemptId, _ agentwire.CancellationReason) { cancels <- att }
		})
		f := acceptFake(t, l, a, 1, nil)
		enginetest.AwaitConnected(t, a)
		offers := []*agentwire.LeaseOfferV1{fakeOffer(a, 1), fakeOffer(a, 2), fakeOffer(a, 3)}
		for _, o := range offers {
			_, _ = f.ch.SendMsg(o)
			enginetest.AwaitStart(t, exec)
		}
		_ = f.bc.CloseWithCode(wire.CloseInternalError, "daemon crashed")
		stale, cancel, cont := offers[0], offers[1], offers[2]
		f2 := acceptFake(t, l, a, 2, func(r *agentwire.AgentResyncV1) *agentwire.ResyncResponseV1 {
			if len(r.ActiveAttempts) != 3 {
				t.Errorf("resync claims %d attempts", len(r.ActiveAttempts))
			}
			return &agentwire.ResyncResponseV1{Results: []agentwire.ResyncResultV1{
				{Attempt: stale.Attempt, Lease: stale.Lease, Decision: agentwire.ResyncDecisionV1{Kind: agentwire.DecisionStale}},
				{Attempt: cancel.Attempt, Lease: cancel.Lease, Decision: agentwire.ResyncDecisionV1{Kind: agentwire.DecisionCancel, Reason: agentwire.CancelUserRequested}},
				{Attempt: cont.Attempt, Lease: cont.Lease, Decision: agentwire.ResyncDecisionV1{Kind: agentwire.DecisionContinue, ExpiresAtMs: 1, TTLMs: 1}},
			}}
		})
		got := map[wire.JobAttemptId]bool{<-cancels: true, <-cancels: true}
		if !got[stale.Attempt] || !got[cancel.Attempt] {
			t.Fatalf("cancelled %v", got)
		}
		e := f2.recv()
		c, ok := e.Payload.(*agentwire.AttemptCompletionV1)
		if !ok || c.Attempt != cancel.Attempt || c.Result.Kind != agentwire.ResultCancelled {
			t.Fatalf("first message after resync: %+v", e.Payload)
		}
		_ = f2.ch.Reply(e, &agentwire.CompletionAckV1{Attempt: c.Attempt, Lease: c.Lease, Kind: agentwire.AckAccepted})
		deadline := time.Now().Add(5 * time.Second)
		for s := a.Status(); len(s.Running) != 1 || s.Running[0] != cont.Attempt; s = a.Status() {
			if time.Now().After(deadline) { // executors end asynchronously; no event marks it
				t.Fatalf("running %v, want only the continued attempt", s.Running)
			}
			time.Sleep(time.Millisecond)
		}
		close(exec.Release)
		e = f2.recv()
		if c, ok := e.Payload.(*agentwire.AttemptCompletionV1); !ok || c.Attempt != cont.Attempt {
			t.Fatalf("next message %+v: the stale attempt must never complete", e.Payload)
		}
	})
}

// blackhole is an endpoint whose dial hangs until its context ends.
type blackhole struct{}

func (blackhole) Dial(ctx context.Context, addr string) (semantics.BackendConn, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestFallbackStaggerAndFailover: with a hanging first endpoint the agent
// reaches the second after the fallback stagger (happy eyeballs), well
// before the first dial times out; without a stagger it fails over after
// the timeout.
func TestFallbackStaggerAndFailover(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		start := time.Now()
		a, _, _ := w.StartAgent(id, enginetest.NewCountingExec(false), func(c *agent.Config) {
			c.RequestTimeout = 3 * time.Second
			c.FallbackStagger = []time.Duration{20 * time.Millisecond}
			c.Endpoints = append([]agent.Endpoint{{Address: "blackhole", Dialer: blackhole{}, Backend: "none"}}, c.Endpoints...)
		})
		s := enginetest.AwaitConnected(t, a)
		if el := time.Since(start); el > 2*time.Second {
			t.Fatalf("connected after %v: the fallback waited for the hanging dial", el)
		}
		if s.Endpoint != w.Addr {
			t.Fatalf("connected to %s", s.Endpoint)
		}
		// Sequential failover: the hanging dial must time out first.
		id2 := w.NewIdentity()
		start = time.Now()
		a2, _, _ := w.StartAgent(id2, enginetest.NewCountingExec(false), func(c *agent.Config) {
			c.RequestTimeout = 300 * time.Millisecond
			c.Endpoints = append([]agent.Endpoint{{Address: "blackhole", Dialer: blackhole{}, Backend: "none"}}, c.Endpoints...)
		})
		enginetest.AwaitConnected(t, a2)
		if el := time.Since(start); el < 300*time.Millisecond {
			t.Fatalf("sequential failover connected after %v, before the first dial's timeout", el)
		}
	})
}

func isClose(err error, code wire.CloseCode) bool {
	var ce *semantics.ConnError
	return errors.As(err, &ce) && ce.Code == code
}
