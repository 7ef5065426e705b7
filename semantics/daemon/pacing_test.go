package daemon_test

import (
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// slowRegistrations sets a registration rate of perSecond with a burst of
// 1: after the first hello the next token is 1/perSecond away, beyond
// MaxRegistrationHold (2 s) for perSecond ≤ 0.25, so the next hellos are
// deferred.
func slowRegistrations(perSecond float64) enginetest.WorldOpt {
	return func(c *daemon.Config) {
		c.Bounds.Admission.RegistrationRate = semantics.Rate{PerSecond: perSecond, Burst: 1}
		c.Timing.RegistrationTimeout = 30 * time.Second
		c.Timing.MaxBackoff = 30 * time.Second
	}
}

// TestRegistrationDeferredHint (real loopback QUIC): over the registration
// rate a hello from an agent advertising RetryAfterV1 is answered
// RegistrationDeferredV1 with a retry hint of at least the wait for a
// token, a hello without the feature gets the RegistrationRejectedV1
// {Overloaded, RetryBackoff} of before (old agents interoperate), both are
// closed with CloseOverloaded, and the two deferred agents get different
// slots one registration interval apart or more.
func TestRegistrationDeferredHint(t *testing.T) {
	w := enginetest.NewWorld(t, enginetest.QuicBackend(), slowHeartbeat, slowRegistrations(0.1))
	first := w.DialRaw(w.NewIdentity())
	first.Hello(agentwire.RoleAgent) // takes the burst token

	hello := func(features wire.FeatureSet) (wire.Message, *enginetest.RawClient) {
		rc := w.DialRaw(w.NewIdentity())
		env, err := rc.Call(&agentwire.TransportHelloV1{Role: agentwire.RoleAgent, Versions: wire.Supported, AgentVersion: "raw", Features: features})
		if err != nil {
			t.Fatal(err)
		}
		return env.Payload, rc
	}
	m1, rc1 := hello(wire.Implemented)
	d1, ok := m1.(*agentwire.RegistrationDeferredV1)
	if !ok {
		t.Fatalf("hello with RetryAfterV1 over the rate answered %T, want RegistrationDeferredV1", m1)
	}
	// The token is ~10 s away (less what the dials took); the hint is the
	// slot after that wait plus up to one interval (10 s) of jitter.
	if d1.Code != wire.ErrCodeOverloaded || d1.RetryAfterMs < 6000 || d1.RetryAfterMs > 20100 {
		t.Fatalf("deferral %+v: want Overloaded with a hint in [6 s, 20.1 s]", d1)
	}
	if code := rc1.CloseCode(); code != wire.CloseOverloaded {
		t.Fatalf("deferred connection closed with %s, want Overloaded", code)
	}
	m2, rc2 := hello(wire.Implemented)
	d2, ok := m2.(*agentwire.RegistrationDeferredV1)
	if !ok {
		t.Fatalf("second deferred hello answered %T", m2)
	}
	// The second slot starts one interval (10 s) after the first, which
	// started ≥ 6 s after the first deferral; the second hello came less
	// than 5 s after it: its hint is ≥ 11 s (and within MaxBackoff).
	if d2.RetryAfterMs < 11000 || d2.RetryAfterMs > 30000 {
		t.Fatalf("second hint %d ms (first %d ms): want [11 s, 30 s], the next slot", d2.RetryAfterMs, d1.RetryAfterMs)
	}
	_ = rc2.CloseCode()
	m3, rc3 := hello(wire.Features(wire.FeatureLogResumeV1)) // an agent without RetryAfterV1
	r3, ok := m3.(*agentwire.RegistrationRejectedV1)
	if !ok {
		t.Fatalf("hello without RetryAfterV1 answered %T, want RegistrationRejectedV1", m3)
	}
	if r3.Code != wire.ErrCodeOverloaded || r3.Retry != wire.RetryBackoff || !strings.Contains(r3.Message, "retry after") {
		t.Fatalf("old-agent rejection %+v", r3)
	}
	if code := rc3.CloseCode(); code != wire.CloseOverloaded {
		t.Fatalf("rejected connection closed with %s, want Overloaded", code)
	}
	st := w.D.HardeningStats()
	if st.RefusedRegistrations != 3 || st.DeferredRegistrations != 2 {
		t.Fatalf("stats refused %d deferred %d, want 3 and 2", st.RefusedRegistrations, st.DeferredRegistrations)
	}
}

// TestRegistrationHeld (real loopback QUIC): a hello less than
// MaxRegistrationHold over the rate is held for its token and then
// acknowledged, not refused.
func TestRegistrationHeld(t *testing.T) {
	w := enginetest.NewWorld(t, enginetest.QuicBackend(), slowHeartbeat, func(c *daemon.Config) {
		c.Bounds.Admission.RegistrationRate = semantics.Rate{PerSecond: 0.55, Burst: 1} // next token 1.8 s away
	})
	w.DialRaw(w.NewIdentity()).Hello(agentwire.RoleAgent)
	rc := w.DialRaw(w.NewIdentity())
	rc.Hello(agentwire.RoleAgent) // fails the test unless acknowledged
	if st := w.D.HardeningStats(); st.HeldRegistrations != 1 || st.RefusedRegistrations != 0 {
		t.Fatalf("stats held %d refused %d, want 1 and 0", st.HeldRegistrations, st.RefusedRegistrations)
	}
}
