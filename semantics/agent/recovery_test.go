package agent_test

import (
	"context"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/health"
	wlogs "forgeyard.dev/transport/wire/logs"
)

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
			case *agentwire.HeartbeatV1, *agentwire.PhaseChangeV1, *health.HealthSummaryV1:
				continue // unsolicited reports a real daemon absorbs
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
			_, fams := enginetest.ScrapeFamilies(t, metrics)
			if dup = enginetest.FamilyValue(fams, "forgeyard_transport_messages_total", "family", "agent", "outcome", "duplicate"); dup >= 2 {
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
