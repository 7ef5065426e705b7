package agent_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/daemon"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// slowHeartbeat keeps raw clients (which send no heartbeats) alive.
func slowHeartbeat(c *daemon.Config) { c.Timing.HeartbeatInterval = 10 * time.Second }

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

// timedDialer records when each dial started.
type timedDialer struct {
	inner semantics.BackendDialer
	mu    sync.Mutex
	at    []time.Time
}

func (d *timedDialer) Dial(ctx context.Context, addr string) (semantics.BackendConn, error) {
	d.mu.Lock()
	d.at = append(d.at, time.Now())
	d.mu.Unlock()
	return d.inner.Dial(ctx, addr)
}

func (d *timedDialer) times() []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]time.Time(nil), d.at...)
}

// TestAgentObeysRetryHint (real loopback QUIC, the library agent): a
// deferred agent does not dial again before the daemon's hint — at least
// the ~4 s wait for a registration token, far above its own 5–50 ms
// backoff — and then registers.
func TestAgentObeysRetryHint(t *testing.T) {
	w := enginetest.NewWorld(t, enginetest.QuicBackend(), slowHeartbeat, slowRegistrations(0.25))
	w.DialRaw(w.NewIdentity()).Hello(agentwire.RoleAgent) // takes the burst token
	var td *timedDialer
	id := w.NewIdentity()
	a, _, _ := w.StartAgent(id, agent.ExecutorFunc(func(context.Context, agent.Job, agent.Output) agent.Result { return agent.Result{} }),
		func(c *agent.Config) {
			c.RequestTimeout = 5 * time.Second
			td = &timedDialer{inner: c.Endpoints[0].Dialer}
			c.Endpoints[0].Dialer = td
		})
	w.AwaitRegistered(id.Runner)
	at := td.times()
	if len(at) < 2 {
		t.Fatalf("%d dials: the agent was never deferred", len(at))
	}
	if gap := at[1].Sub(at[0]); gap < 2*time.Second {
		t.Fatalf("the agent dialed again %v after its deferral: it did not obey the retry hint", gap)
	}
	if n := a.Stats().RetryHintsObeyed; n < 1 {
		t.Fatalf("RetryHintsObeyed = %d", n)
	}
	if st := w.D.HardeningStats(); st.DeferredRegistrations < 1 {
		t.Fatalf("daemon deferred %d registrations", st.DeferredRegistrations)
	}
}

// laterError is a backend's refusal before the handshake with an
// appointment (as backends/quic's dial returns for a CONNECTION_REFUSED
// whose retry_after_ms outlasts the dial).
type laterError struct{ after time.Duration }

func (e laterError) Error() string             { return "refused: come back later" }
func (e laterError) RetryAfter() time.Duration { return e.after }

// refusingDialer refuses its first dial with a laterError, then dials.
type refusingDialer struct {
	timedDialer
	after time.Duration
}

func (d *refusingDialer) Dial(ctx context.Context, addr string) (semantics.BackendConn, error) {
	d.mu.Lock()
	d.at = append(d.at, time.Now())
	first := len(d.at) == 1
	d.mu.Unlock()
	if first {
		return nil, laterError{d.after}
	}
	return d.inner.Dial(ctx, addr)
}

// TestAgentObeysDialRetryAfter (real loopback QUIC): a dial refused with an
// appointment (an error with RetryAfter) is not retried before it — far
// above the agent's own first backoff — and the agent then registers.
func TestAgentObeysDialRetryAfter(t *testing.T) {
	const after = 1500 * time.Millisecond
	w := enginetest.NewWorld(t, enginetest.QuicBackend(), slowHeartbeat)
	var rd *refusingDialer
	id := w.NewIdentity()
	a, _, _ := w.StartAgent(id, agent.ExecutorFunc(func(context.Context, agent.Job, agent.Output) agent.Result { return agent.Result{} }),
		func(c *agent.Config) {
			rd = &refusingDialer{timedDialer: timedDialer{inner: c.Endpoints[0].Dialer}, after: after}
			c.Endpoints[0].Dialer = rd
		})
	w.AwaitRegistered(id.Runner)
	at := rd.times()
	if len(at) < 2 {
		t.Fatalf("%d dials: the refusal was never seen", len(at))
	}
	if gap := at[1].Sub(at[0]); gap < after {
		t.Fatalf("the agent dialed again %v after a refusal that said %v: it did not obey the appointment", gap, after)
	}
	if n := a.Stats().RetryHintsObeyed; n < 1 {
		t.Fatalf("RetryHintsObeyed = %d", n)
	}
}
