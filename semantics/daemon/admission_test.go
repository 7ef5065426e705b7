package daemon_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wcas "forgeyard.dev/transport/wire/cas"
	"forgeyard.dev/transport/wire/health"
)

// rttBound is the heartbeat round trip a well-behaved agent must keep
// while another peer floods the same daemon (2 shared cores, -race).
const rttBound = time.Second

// rttProbe heartbeats on a joined raw client every interval until stop
// and reports the round trips.
type rttProbe struct {
	done chan struct{}
	rtts []time.Duration
	err  error
}

func startProbe(rc *enginetest.RawClient, stop <-chan struct{}, interval time.Duration) *rttProbe {
	p := &rttProbe{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for seq := uint64(1); ; seq++ {
			start := time.Now()
			env, err := rc.Ch.Call(context.Background(), control.Out{Msg: &agentwire.HeartbeatV1{Runner: rc.Id.Runner, Session: rc.Sess, Seq: seq}}, 5*time.Second)
			if err != nil {
				p.err = err
				return
			}
			if _, ok := env.Payload.(*agentwire.HeartbeatAckV1); !ok {
				p.err = errors.New("heartbeat answered with " + env.Payload.MessageType().String())
				return
			}
			p.rtts = append(p.rtts, time.Since(start))
			select {
			case <-stop:
				return
			case <-time.After(interval):
			}
		}
	}()
	return p
}

// check waits for the probe and asserts it kept heartbeating within
// rttBound; it returns the median and maximum.
func (p *rttProbe) check(t *testing.T) (time.Duration, time.Duration) {
	t.Helper()
	<-p.done
	if p.err != nil {
		t.Fatalf("well-behaved client's heartbeat failed during the flood: %v", p.err)
	}
	if len(p.rtts) < 2 {
		t.Fatalf("only %d heartbeats during the flood", len(p.rtts))
	}
	s := slices.Clone(p.rtts)
	slices.Sort(s)
	med, mx := s[len(s)/2], s[len(s)-1]
	if mx > rttBound {
		t.Fatalf("heartbeat RTT max %v over %v during the flood (median %v, %d samples)", mx, rttBound, med, len(s))
	}
	return med, mx
}

// helloOutcome dials and sends a hello without failing the test: "ack",
// "rejected" (RegistrationRejectedV1 Overloaded/RetryBackoff with a retry
// hint), "closed" (CloseOverloaded at connect) or an error.
func helloOutcome(w *enginetest.World, id enginetest.Identity, keep *[]semantics.BackendConn, mu *sync.Mutex) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bc, err := w.B.Dialer(w.T, w.ClientTLS(id)).Dial(ctx, w.Addr)
	if err != nil {
		return "", err
	}
	mu.Lock()
	*keep = append(*keep, bc)
	mu.Unlock()
	closed := func() (string, error) {
		<-bc.Context().Done()
		var ce *semantics.ConnError
		if errors.As(context.Cause(bc.Context()), &ce) && ce.Code == wire.CloseOverloaded {
			return "closed", nil
		}
		return "", context.Cause(bc.Context())
	}
	sc, err := semantics.NewConn(bc, semantics.Config{})
	if err != nil {
		return "", err
	}
	st, err := sc.OpenStream(ctx, wire.StreamControl)
	if err != nil {
		return closed()
	}
	ch := control.New(st, control.Config{})
	go func() { _ = ch.Run(func(*wire.Envelope) {}, nil) }()
	env, err := ch.Call(ctx, control.Out{Msg: &agentwire.TransportHelloV1{Role: agentwire.RoleAgent, Versions: wire.Supported, AgentVersion: "flood"}}, 5*time.Second)
	if err != nil {
		return closed()
	}
	switch m := env.Payload.(type) {
	case *agentwire.HelloAckV1:
		return "ack", nil
	case *agentwire.RegistrationRejectedV1:
		if m.Code != wire.ErrCodeOverloaded || m.Retry != wire.RetryBackoff || !strings.Contains(m.Message, "retry after") {
			return "", errors.New("unexpected rejection: " + m.Message)
		}
		if o, _ := closed(); o != "closed" {
			return "", errors.New("rejected hello not followed by CloseOverloaded")
		}
		return "rejected", nil
	}
	return "", errors.New("hello answered with " + env.Payload.MessageType().String())
}

// TestRegistrationFloodAdmission (real loopback QUIC): 48 connections
// hello at once against a registration rate of 0.2/s (burst 4: the next
// token is further away than MaxRegistrationHold) and 12 handshake slots.
// Beyond the rate the hello is answered
// RegistrationRejectedV1{Overloaded, RetryBackoff, "retry after …"} and
// closed with CloseOverloaded; beyond the slots the connection is closed
// with CloseOverloaded at once. A registered agent on the same daemon
// keeps its heartbeat RTT under rttBound throughout.
func TestRegistrationFloodAdmission(t *testing.T) {
	w := enginetest.NewWorld(t, enginetest.QuicBackend(), slowHeartbeat, func(c *daemon.Config) {
		c.Bounds.Admission = daemon.Admission{MaxHandshakes: 12, RegistrationRate: semantics.Rate{PerSecond: 0.2, Burst: 4}}
	})
	good := w.DialRaw(w.NewIdentity())
	good.Join(wire.NewAgentSessionId())
	stop := make(chan struct{})
	probe := startProbe(good, stop, 100*time.Millisecond)

	const floods, workers = 48, 8
	var (
		mu     sync.Mutex
		keep   []semantics.BackendConn
		counts = map[string]int{}
		errs   []error
		wg     sync.WaitGroup
		next   atomic.Int64
	)
	ids := make([]enginetest.Identity, workers)
	for i := range ids {
		ids[i] = w.NewIdentity()
	}
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= floods {
				o, err := helloOutcome(w, ids[i], &keep, &mu)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					counts[o]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(stop)
	med, mx := probe.check(t)
	for _, bc := range keep {
		_ = bc.CloseWithCode(wire.CloseNormal, "")
	}
	if len(errs) > 0 {
		t.Fatalf("%d unexpected outcomes, first: %v", len(errs), errs[0])
	}
	st := w.D.HardeningStats()
	t.Logf("outcomes %v; stats refused conns %d, refused registrations %d; good heartbeat RTT median %v max %v",
		counts, st.RefusedConns, st.RefusedRegistrations, med, mx)
	if counts["rejected"] == 0 || int64(counts["rejected"]) != st.RefusedRegistrations {
		t.Fatalf("rejected hellos %d, daemon counted %d: the registration rate never applied", counts["rejected"], st.RefusedRegistrations)
	}
	if counts["ack"] > 12 {
		t.Fatalf("%d hellos admitted, more than the 12 handshake slots", counts["ack"])
	}
	if counts["ack"]+counts["rejected"]+counts["closed"] != floods {
		t.Fatalf("outcomes %v do not add up to %d", counts, floods)
	}
}

// TestHandshakeSlotsBounded: with MaxHandshakes 3, a fourth unregistered
// connection is closed at once with CloseOverloaded; registering one frees
// its slot for a new connection.
func TestHandshakeSlotsBounded(t *testing.T) {
	w := enginetest.NewWorld(t, enginetest.MemoryBackend(), slowHeartbeat, func(c *daemon.Config) {
		c.Bounds.Admission.MaxHandshakes = 3
		c.Timing.RegistrationTimeout = 30 * time.Second
	})
	var rcs []*enginetest.RawClient
	for range 3 {
		rc := w.DialRaw(w.NewIdentity())
		rc.Hello(agentwire.RoleAgent) // holds its slot: hello answered, not registered
		rcs = append(rcs, rc)
	}
	if n := w.D.HardeningStats().Handshakes; n != 3 {
		t.Fatalf("handshakes in progress %d, want 3", n)
	}
	over := dialRawNoStream(w, w.NewIdentity())
	if code := over.CloseCode(); code != wire.CloseOverloaded {
		t.Fatalf("fourth handshake closed with %s, want Overloaded", code)
	}
	if _, ok := rcs[0].Register(wire.NewAgentSessionId()).(*agentwire.RegistrationAcceptedV1); !ok {
		t.Fatal("registration refused")
	}
	rc := w.DialRaw(w.NewIdentity())
	rc.Hello(agentwire.RoleAgent) // admitted: the registered connection released its slot
	if st := w.D.HardeningStats(); st.RefusedConns != 1 || st.Handshakes != 3 {
		t.Fatalf("stats %+v: want 1 refused connection, 3 handshakes in progress", st)
	}
}

// dialRawNoStream dials without opening anything, for connections the
// daemon refuses at connect.
func dialRawNoStream(w *enginetest.World, id enginetest.Identity) *enginetest.RawClient {
	w.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	bc, err := w.B.Dialer(w.T, w.ClientTLS(id)).Dial(ctx, w.Addr)
	if err != nil {
		w.T.Fatal(err)
	}
	w.T.Cleanup(func() { _ = bc.CloseWithCode(wire.CloseNormal, "") })
	return &enginetest.RawClient{T: w.T, Bc: bc, Id: id}
}

// TestPerIPLimit (QUIC, real addresses): off by default (§223: NAT); with
// MaxConnsPerIP 2 a third connection from 127.0.0.1 is closed with
// CloseOverloaded, and a freed slot admits again.
func TestPerIPLimit(t *testing.T) {
	w := enginetest.NewWorld(t, enginetest.QuicBackend(), slowHeartbeat)
	for range 4 {
		w.DialRaw(w.NewIdentity()).Hello(agentwire.RoleAgent)
	}
	if st := w.D.HardeningStats(); st.RefusedConns != 0 {
		t.Fatalf("default config refused %d connections: the per-IP limit must be off by default", st.RefusedConns)
	}

	w = enginetest.NewWorld(t, enginetest.QuicBackend(), slowHeartbeat, func(c *daemon.Config) { c.Bounds.Admission.MaxConnsPerIP = 2 })
	a := w.DialRaw(w.NewIdentity())
	a.Hello(agentwire.RoleAgent)
	w.DialRaw(w.NewIdentity()).Hello(agentwire.RoleAgent)
	if code := dialRawNoStream(w, w.NewIdentity()).CloseCode(); code != wire.CloseOverloaded {
		t.Fatalf("third connection from one IP closed with %s, want Overloaded", code)
	}
	_ = a.Bc.CloseWithCode(wire.CloseNormal, "")
	deadline := time.Now().Add(5 * time.Second)
	for { // no event marks the daemon's teardown of a; poll its sessions
		if len(w.D.Sessions()) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("closed connection never left the daemon")
		}
		time.Sleep(5 * time.Millisecond)
	}
	w.DialRaw(w.NewIdentity()).Hello(agentwire.RoleAgent)
}

// drainErrors counts the WireErrorV1 answers a flooding raw client gets,
// by code, and checks each rate-limit answer carries RetryBackoff and a
// "rate limit" message.
type errCounter struct {
	mu     sync.Mutex
	byCode map[wire.ProtocolErrorCode]int
	bad    []string
	msgs   []string
}

func drainErrors(rc *enginetest.RawClient) *errCounter {
	ec := &errCounter{byCode: map[wire.ProtocolErrorCode]int{}}
	go func() {
		for {
			select {
			case e := <-rc.In:
				we, ok := e.Payload.(*wire.WireErrorV1)
				if !ok {
					continue
				}
				ec.mu.Lock()
				ec.byCode[we.Code]++
				if we.Code == wire.ErrCodeRateLimited {
					if we.Retry != wire.RetryBackoff || !strings.Contains(we.Message, "rate limit") || !strings.Contains(we.Message, "retry after") {
						ec.bad = append(ec.bad, we.Retry.String()+": "+we.Message)
					}
					if len(ec.msgs) < 4 {
						ec.msgs = append(ec.msgs, we.Message)
					}
				}
				ec.mu.Unlock()
			case <-rc.Bc.Context().Done():
				return
			}
		}
	}()
	return ec
}

func (ec *errCounter) first() string {
	ec.mu.Lock()
	defer ec.mu.Unlock()
	if len(ec.msgs) == 0 {
		return ""
	}
	return ec.msgs[0]
}

func (ec *errCounter) count(code wire.ProtocolErrorCode) int {
	ec.mu.Lock()
	defer ec.mu.Unlock()
	return ec.byCode[code]
}

// awaitCount polls (no event marks an error's arrival on the drain) until
// at least n errors of code arrived.
func (ec *errCounter) awaitCount(t *testing.T, code wire.ProtocolErrorCode, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for ec.count(code) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d %s answers, want ≥ %d", ec.count(code), code, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	ec.mu.Lock()
	defer ec.mu.Unlock()
	if len(ec.bad) > 0 {
		t.Fatalf("rate-limit answers without RetryBackoff/retry hint: %q", ec.bad)
	}
}

// TestControlFloodRateLimited (real loopback QUIC): a registered peer
// sends control messages as fast as it can for 1 s against ControlRate
// 200/s burst 100. The excess is answered WireErrorV1{RateLimited,
// RetryBackoff, "… retry after …"}, the flooder stays connected (strikes
// below the limit), and a well-behaved agent keeps its heartbeat RTT under
// rttBound.
func TestControlFloodRateLimited(t *testing.T) {
	w := enginetest.NewWorld(t, enginetest.QuicBackend(), slowHeartbeat, func(c *daemon.Config) {
		c.Bounds.Conn.ControlRate = semantics.Rate{PerSecond: 200, Burst: 100}
		c.Bounds.Conn.MaxRateStrikes = 1 << 20
	})
	good := w.DialRaw(w.NewIdentity())
	good.Join(wire.NewAgentSessionId())
	flood := w.DialRaw(w.NewIdentity())
	flood.Join(wire.NewAgentSessionId())
	ec := drainErrors(flood)
	stop := make(chan struct{})
	probe := startProbe(good, stop, 100*time.Millisecond)
	upd := &agentwire.CapabilityUpdateV1{Digest: wire.CapabilityDigest{Digest: wire.Digest{9}},
		Full: agentwire.RunnerCapabilitiesV1{OS: "linux", Arch: "amd64", MaxParallel: 1}}
	start := time.Now()
	n := 0
	for ; n < 200_000 && time.Since(start) < time.Second; n++ { // flood for 1 s
		if _, err := flood.Ch.SendMsg(upd); err != nil {
			t.Fatalf("flood send %d: %v", n, err)
		}
	}
	sent := time.Since(start)
	ec.awaitCount(t, wire.ErrCodeRateLimited, n/2)
	close(stop)
	med, mx := probe.check(t)
	st := w.D.HardeningStats()
	t.Logf("%d control messages in %v: %d answered RateLimited (daemon counted %d), e.g. %q; good heartbeat RTT median %v max %v",
		n, sent, ec.count(wire.ErrCodeRateLimited), st.RateLimited.Control, ec.first(), med, mx)
	if flood.Bc.Context().Err() != nil {
		t.Fatal("flooder closed although its strikes stayed under MaxRateStrikes")
	}
}

// TestPerConnectionRateLimits (memory backend): heartbeats, health
// requests and CAS requests each have their own rate; a burst of each is
// answered RateLimited beyond it (an excessive heartbeat is not counted as
// liveness), a well-behaved agent on the same daemon keeps its heartbeat
// RTT, and a peer that persists is closed with CloseLimitExceeded.
func TestPerConnectionRateLimits(t *testing.T) {
	cases := []struct {
		name  string
		probe time.Duration // the good client's heartbeat period: within HeartbeatRate
		limit func(*semantics.Limits)
		msg   func(rc *enginetest.RawClient, i int) wire.Message
	}{
		{"heartbeat", 250 * time.Millisecond, func(l *semantics.Limits) { l.HeartbeatRate = semantics.Rate{PerSecond: 5, Burst: 3} },
			func(rc *enginetest.RawClient, i int) wire.Message {
				return &agentwire.HeartbeatV1{Runner: rc.Id.Runner, Session: rc.Sess, Seq: uint64(i + 1)}
			}},
		{"health", 50 * time.Millisecond, func(l *semantics.Limits) { l.HealthRate = semantics.Rate{PerSecond: 5, Burst: 3} },
			func(*enginetest.RawClient, int) wire.Message { return &health.ProbeRequestV1{Probe: health.ProbeClock} }},
		{"cas", 50 * time.Millisecond, func(l *semantics.Limits) { l.CasRate = semantics.Rate{PerSecond: 5, Burst: 3} },
			func(*enginetest.RawClient, int) wire.Message {
				return &wcas.NeedObjectsV1{Lease: wire.NewLeaseId(), Objects: []wire.CasObjectRef{{Algorithm: wire.DigestSHA256, Digest: wire.Digest{1}, Size: 1}}}
			}},
		// Renewal requests: each would sign a certificate and record it
		// in the authority (this daemon has no issuer, so those within the
		// rate are refused as unsupported; the rate applies first).
		{"identity", 50 * time.Millisecond, func(l *semantics.Limits) { l.IdentityRate = semantics.Rate{PerSecond: 0.5, Burst: 3} },
			func(*enginetest.RawClient, int) wire.Message {
				return &agentwire.CertificateRequestV1{CSR: []byte{0x30, 0}}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := enginetest.NewWorld(t, enginetest.MemoryBackend(), slowHeartbeat, func(c *daemon.Config) {
				tc.limit(&c.Bounds.Conn)
				c.Bounds.Conn.MaxRateStrikes = 200
			})
			good := w.DialRaw(w.NewIdentity())
			good.Join(wire.NewAgentSessionId())
			flood := w.DialRaw(w.NewIdentity())
			flood.Join(wire.NewAgentSessionId())
			ec := drainErrors(flood)
			stop := make(chan struct{})
			probe := startProbe(good, stop, tc.probe)
			for i := range 20 {
				if _, err := flood.Ch.SendMsg(tc.msg(flood, i)); err != nil {
					t.Fatal(err)
				}
			}
			ec.awaitCount(t, wire.ErrCodeRateLimited, 10)
			if ec.first() == "" || !strings.Contains(ec.first(), map[string]string{"heartbeat": "heartbeat", "health": "health", "cas": "CAS", "identity": "certificate request"}[tc.name]) {
				t.Fatalf("rate-limit message %q does not name the limit", ec.first())
			}
			// Persisting (paced, so the probe samples the flood): strikes
			// pass MaxRateStrikes → CloseLimitExceeded.
			for i := 20; i < 5000 && flood.Bc.Context().Err() == nil; i++ {
				_, _ = flood.Ch.SendMsg(tc.msg(flood, i))
				time.Sleep(5 * time.Millisecond)
			}
			if code := flood.CloseCode(); code != wire.CloseLimitExceeded {
				t.Fatalf("persistent flooder closed with %s, want LimitExceeded", code)
			}
			close(stop)
			med, mx := probe.check(t)
			t.Logf("%s: %d RateLimited answers, e.g. %q; good heartbeat RTT median %v max %v", tc.name, ec.count(wire.ErrCodeRateLimited), ec.first(), med, mx)
			if st := w.D.HardeningStats(); st.LimitCloses != 1 {
				t.Fatalf("limit closes %d, want 1", st.LimitCloses)
			}
		})
	}
}

// TestOneActiveTransportPerSession (§222): five transports register the
// same agent session one after another; each new one fences the previous
// (CloseSessionFenced), and the daemon holds exactly one unfenced
// transport of the session at the end.
func TestOneActiveTransportPerSession(t *testing.T) {
	w := enginetest.NewWorld(t, enginetest.MemoryBackend(), slowHeartbeat)
	id := w.NewIdentity()
	sess := wire.NewAgentSessionId()
	var prev *enginetest.RawClient
	for range 5 {
		rc := w.DialRaw(id)
		rc.Join(sess)
		if prev != nil {
			if code := prev.CloseCode(); code != wire.CloseSessionFenced {
				t.Fatalf("previous transport closed with %s, want SessionFenced", code)
			}
		}
		prev = rc
	}
	deadline := time.Now().Add(5 * time.Second)
	for { // teardown of the fenced transports has no event; poll
		live := 0
		var n int
		for _, s := range w.D.Sessions() {
			if s.Session == sess {
				n++
				if !s.Fenced {
					live++
				}
			}
		}
		if live != 1 {
			t.Fatalf("%d unfenced transports of one session", live)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d transports of the session remain", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestDowngradeRejectedInsideTLSAudited (QUIC): a peer with a valid client
// certificate offering only versions below Config.MinProtocol is refused
// on the TLS connection (handshake complete, client chain verified) with
// RegistrationRejectedV1{UnsupportedVersion} naming the policy minimum,
// closed with CloseVersionMismatch, and a protocol.downgrade_rejected audit
// event is written.
func TestDowngradeRejectedInsideTLSAudited(t *testing.T) {
	w := enginetest.NewWorld(t, enginetest.QuicBackend(), func(c *daemon.Config) {
		c.Protocol = wire.ProtocolRange{Min: wire.V(1, 0), Max: wire.V(1, 5)}
		c.MinProtocol = wire.V(1, 3)
	})
	rc := w.DialRaw(w.NewIdentity())
	if cs := rc.Bc.ConnectionState(); !cs.HandshakeComplete || len(cs.PeerCertificates) == 0 {
		t.Fatalf("not a completed TLS connection: %+v", cs)
	}
	env, err := rc.Call(&agentwire.TransportHelloV1{Role: agentwire.RoleAgent, Versions: wire.ProtocolRange{Min: wire.V(1, 0), Max: wire.V(1, 2)}, AgentVersion: "old"})
	if err != nil {
		t.Fatal(err)
	}
	rej, ok := env.Payload.(*agentwire.RegistrationRejectedV1)
	if !ok || rej.Code != wire.ErrCodeUnsupportedVersion || rej.Retry != wire.RetryUnsupported || !strings.Contains(rej.Message, "below this daemon's policy minimum 1.3") {
		t.Fatalf("downgrade answered %#v", env.Payload)
	}
	if code := rc.CloseCode(); code != wire.CloseVersionMismatch {
		t.Fatalf("closed with %s", code)
	}
	if logs := w.LogBuf.String(); !strings.Contains(logs, `"event":"protocol.downgrade_rejected"`) || !strings.Contains(logs, `"reason":"version_below_minimum"`) {
		t.Fatalf("no downgrade audit event in:\n%s", logs)
	}
	// A hello whose range reaches the minimum negotiates normally.
	env, err = w.DialRaw(w.NewIdentity()).Call(&agentwire.TransportHelloV1{Role: agentwire.RoleAgent, Versions: wire.ProtocolRange{Min: wire.V(1, 0), Max: wire.V(1, 4)}, AgentVersion: "new"})
	if err != nil {
		t.Fatal(err)
	}
	if ack, ok := env.Payload.(*agentwire.HelloAckV1); !ok || ack.Negotiated != wire.V(1, 4) {
		t.Fatalf("hello reaching the minimum answered %#v", env.Payload)
	}
}

// TestReplayAudited: the replays that TestOldLeaseReplayRejected,
// TestOldAgentSessionReplayRejected and TestCompletionRetryAfterLostAck
// show harmless also leave audit events: a replayed completion of a
// finished lease and an accept of a lease from another session
// (lease.stale_replay), and a re-registration of a superseded session
// (session.fenced, code StaleSession). A MessageId retry of a completion
// is a duplicate, not an audit event. forgeyard_transport_messages_total
// counts the three completions as ok, duplicate and rejected.
func TestReplayAudited(t *testing.T) {
	metrics := telemetry.NewMetrics()
	w := enginetest.NewWorld(t, enginetest.MemoryBackend(), slowHeartbeat, func(c *daemon.Config) { c.Metrics = metrics })
	id := w.NewIdentity()
	old := wire.NewAgentSessionId()
	rc := w.DialRaw(id)
	rc.Join(old)
	done := make(chan error, 1)
	go func() {
		_, err := w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(3))
		done <- err
	}()
	o, env := enginetest.Next[*agentwire.LeaseOfferV1](t, rc)
	if err := rc.Ch.Reply(env, &agentwire.LeaseAcceptedV1{Lease: o.Lease, Attempt: o.Attempt, Session: old}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	compl := &agentwire.AttemptCompletionV1{Job: o.Job, Attempt: o.Attempt, Lease: o.Lease, Spec: o.SpecID,
		Result: agentwire.ExecutionResultV1{Kind: agentwire.ResultSucceeded}}
	msgID := wire.NewMessageId()
	for i, want := range []agentwire.CompletionAckKind{agentwire.AckAccepted, agentwire.AckDuplicateAccepted} {
		env, err := rc.Ch.Call(context.Background(), control.Out{ID: msgID, Msg: compl}, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if k := env.Payload.(*agentwire.CompletionAckV1).Kind; k != want {
			t.Fatalf("completion %d: %s, want %s", i, k, want)
		}
	}
	if n := strings.Count(w.LogBuf.String(), `"event":"lease.stale_replay"`); n != 0 {
		t.Fatalf("a MessageId retry was audited as a replay (%d events)", n)
	}
	env, err := rc.Call(compl) // new MessageId: a replay
	if err != nil {
		t.Fatal(err)
	}
	if k := env.Payload.(*agentwire.CompletionAckV1).Kind; k != agentwire.AckStaleRejected {
		t.Fatalf("replayed completion: %s", k)
	}
	// The outcome is counted right after the answer is written.
	deadline := time.Now().Add(5 * time.Second)
	var dup, rej float64
	for time.Now().Before(deadline) {
		_, fams := enginetest.ScrapeFamilies(t, metrics)
		dup = enginetest.FamilyValue(fams, "forgeyard_transport_messages_total", "family", "agent", "outcome", "duplicate")
		rej = enginetest.FamilyValue(fams, "forgeyard_transport_messages_total", "family", "agent", "outcome", "rejected")
		if dup >= 1 && rej >= 1 {
			break
		}
		time.Sleep(5 * time.Millisecond) // polls the counters: they have no event to await
	}
	if dup != 1 || rej != 1 {
		t.Fatalf("messages_total{agent}: duplicate %v, rejected %v; want 1 and 1", dup, rej)
	}
	// A new session of the runner; the old lease replayed from it, and the
	// old session replayed.
	rc2 := w.DialRaw(id)
	rc2.Join(wire.NewAgentSessionId())
	_, err = rc2.Call(&agentwire.LeaseAcceptedV1{Lease: o.Lease, Attempt: o.Attempt, Session: rc2.Sess})
	wantWireErr(t, err, wire.ErrCodeStaleLease)
	rc3 := w.DialRaw(id)
	rc3.Hello(agentwire.RoleAgent)
	if rej, ok := rc3.Register(old).(*agentwire.RegistrationRejectedV1); !ok || rej.Code != wire.ErrCodeStaleSession {
		t.Fatalf("old session replay answered %#v", rej)
	}
	logs := w.LogBuf.String()
	if n := strings.Count(logs, `"event":"lease.stale_replay"`); n < 2 {
		t.Fatalf("%d lease.stale_replay events, want ≥ 2:\n%s", n, logs)
	}
	if !strings.Contains(logs, `"event":"session.fenced","transport"`) || !strings.Contains(logs, `"code":"StaleSession"`) {
		t.Fatalf("no session.fenced/StaleSession audit event:\n%s", logs)
	}
	if strings.Contains(logs, "sample-secret") {
		t.Fatal("audit log carries payload text")
	}
}
