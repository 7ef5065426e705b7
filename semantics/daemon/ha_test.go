package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// TestSecondDaemonSharedPostgres (§229): daemons share one PostgreSQL
// authority. The agent runs an attempt on daemon 1; daemon 1 shuts down
// (GoAway naming daemon 2, preferred over the agent's next configured
// endpoint); the agent reconnects to daemon 2 under the same agent
// session, resyncs (Continue) and completes there, exactly once.
func TestSecondDaemonSharedPostgres(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
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
		w2 := enginetest.NewWorldWith(t, b, pki, open(), sharedDB, func(c *daemon.Config) { c.ID = "daemon-2" })
		w3 := enginetest.NewWorldWith(t, b, pki, open(), sharedDB, func(c *daemon.Config) { c.ID = "daemon-3" })
		w1 := enginetest.NewWorldWith(t, b, pki, open(), sharedDB, func(c *daemon.Config) {
			c.ID = "daemon-1"
			c.AlternateEndpoints = []string{w2.Addr}
		})
		id := w1.NewIdentity()
		exec := enginetest.NewCountingExec(true)
		// Configured: daemon 1 then daemon 3; the GoAway must steer the
		// agent to daemon 2 instead of its next configured endpoint.
		a, _, _ := w1.StartAgent(id, exec, func(c *agent.Config) {
			c.Endpoints = append(c.Endpoints, agent.Endpoint{Address: w3.Addr, Dialer: c.Endpoints[0].Dialer, Backend: b.Name})
			// Registrations and resyncs commit to a PostgreSQL three
			// daemons share: on a loaded machine over the harness's
			// 500 ms, and the agent redialed until the test gave up.
			c.RequestTimeout = 5 * time.Second
		})
		w1.AwaitActive(id.Runner)
		go func() { _, _ = w1.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(20)) }()
		job := enginetest.AwaitStart(t, exec)

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := w1.D.Shutdown(ctx); err != nil {
			t.Fatalf("daemon 1 shutdown: %v", err)
		}
		reg := w2.AwaitRegistered(id.Runner)
		if reg.Session != a.Session() || reg.Epoch < 2 {
			t.Fatalf("daemon 2 registration %+v", reg)
		}
		w2.AwaitActive(id.Runner)
		if st := w2.D.Stats(); st.Resyncs < 1 {
			t.Fatalf("daemon 2 stats %+v", st)
		}
		close(exec.Release)
		w2.AwaitCompletion(job.Attempt, agentwire.AckAccepted)
		if n, _ := w2.Auth.Completions(context.Background(), job.Attempt); n != 1 {
			t.Fatalf("completions %d", n)
		}
		if exec.Count(job.Attempt) != 1 {
			t.Fatal("attempt ran twice")
		}
		if s := enginetest.AwaitConnected(t, a); s.Endpoint != w2.Addr {
			t.Fatalf("agent on %s", s.Endpoint)
		}
	})
}

// TestRandomCutsExactlyOnce runs 40 lease lifecycles over memory with
// seeded random connection cuts at random points. Invariant: every
// attempt completes exactly once in the authority; none is lost.
func TestRandomCutsExactlyOnce(t *testing.T) {
	const n = 40
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0x4679))
	w := enginetest.NewWorld(t, enginetest.MemoryBackend(), func(c *daemon.Config) {
		c.Timing.RenewInterval = 20 * time.Millisecond
		c.Timing.RequestTimeout = 100 * time.Millisecond
		c.Timing.LeaseTTL = 30 * time.Second
	})
	id := w.NewIdentity()
	done := make(chan agent.AttemptDone, n*2)
	up := make(chan struct{}, 1) // a connection registered and resynced
	a, rd, _ := w.StartAgent(id, agent.NewSyntheticExecutor(seed, agent.SyntheticOptions{MinDuration: time.Millisecond, MaxDuration: 30 * time.Millisecond}),
		func(c *agent.Config) {
			c.RequestTimeout = 100 * time.Millisecond
			c.Hooks.OnAttemptDone = func(d agent.AttemptDone) { done <- d }
			c.Hooks.OnConnected = func(agent.Status) {
				select {
				case up <- struct{}{}:
				default:
				}
			}
		})
	w.AwaitActive(id.Runner)

	// The chaos goroutine cuts the agent's connection at random moments:
	// each connection once, 5–65 ms after it came up (registered and
	// resynced), so offers, acceptances and completions are cut in flight
	// however slow the machine is. (Cutting on a clock regardless of the
	// connection's state starved a loaded machine: connections were cut
	// before they could register, and the run made no progress.)
	stop := make(chan struct{})
	chaosDone := make(chan int)
	delays := make([]time.Duration, 64)
	for i := range delays {
		delays[i] = time.Duration(5+rng.IntN(60)) * time.Millisecond
	}
	// minCuts: the calm phase starts only after this many cuts, so a fast
	// run cannot finish every offer before the first random cut fires.
	const minCuts = 3
	cutCount := make(chan int, 1024)
	go func() {
		cuts := 0
		for i := 0; ; i++ {
			select {
			case <-stop:
				chaosDone <- cuts
				return
			case <-up:
			}
			select {
			case <-stop:
				chaosDone <- cuts
				return
			case <-time.After(delays[i%len(delays)]):
			}
			if rd.Cut() {
				cuts++
				select {
				case cutCount <- cuts:
				default:
				}
			}
		}
	}()

	attempts := make(map[wire.JobAttemptId]bool)
	// Bounds for a starved machine (two test runs on 2 cores under -race):
	// with 100 ms request timeouts every cut costs retries.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for i := 0; len(attempts) < n; i++ {
		o := enginetest.Offer(100 + i)
		o.Attempt = wire.NewJobAttemptId()
		for {
			// OfferLease waits for the answer; re-sent offers survive cuts.
			_, err := w.D.OfferLease(ctx, id.Runner, o)
			if err == nil {
				attempts[o.Attempt] = true
				break
			}
			if !errors.Is(err, daemon.ErrNotConnected) {
				t.Fatalf("offer %d: %v", i, err)
			}
			w.AwaitActive(id.Runner) // between a cut and the reconnect
		}
	}
	// Let everything finish with the network calm.
	deadlineAll := time.After(2 * time.Minute)
	got := map[wire.JobAttemptId]agentwire.CompletionAckKind{}
	for c := 0; c < minCuts; {
		select {
		case c = <-cutCount:
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d cuts in 30 s", c)
		}
	}
	close(stop)
	cuts := <-chaosDone
	for len(got) < len(attempts) {
		select {
		case d := <-done:
			if attempts[d.Job.Attempt] {
				got[d.Job.Attempt] = d.Ack
			}
		case <-deadlineAll:
			t.Fatalf("%d of %d attempts acknowledged (cuts %d, agent %+v)", len(got), len(attempts), cuts, a.Stats())
		}
	}
	for att := range attempts {
		c, err := w.Auth.Completions(context.Background(), att)
		if err != nil || c != 1 {
			t.Fatalf("attempt %s: %d completions (%v), agent ack %s", att, c, err, got[att])
		}
		if k := got[att]; k != agentwire.AckAccepted && k != agentwire.AckDuplicateAccepted {
			t.Fatalf("attempt %s acknowledged %s", att, k)
		}
	}
	st := a.Stats()
	t.Logf("%d attempts, %d cuts, %d reconnects, %d completion retries, %d duplicate offers absorbed, daemon %s",
		len(attempts), cuts, st.Reconnects, st.CompletionsRetried, st.DuplicatesAbsorbed, fmtAcks(w.D.Stats().Completions))
	if cuts == 0 {
		t.Fatal("no cut happened")
	}
}

func fmtAcks(c [4]int64) string {
	return fmt.Sprintf("acks accepted=%d duplicate=%d stale=%d invalid=%d", c[0], c[1], c[2], c[3])
}
