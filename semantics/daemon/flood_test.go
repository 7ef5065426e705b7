package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/stats"
	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// floodHeapCeiling is the stated bound on the growth of the test process's
// live heap (daemon, both agents, the transports) while one agent floods
// logs as fast as it can. The flood offers many times this much.
const floodHeapCeiling = 48 << 20

// liveHeap reads the heap marked live by the last GC, without stopping the
// world.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestDataLogFloodBounded (§127, §268, §277; §300 "transport queues bounded
// under log/CAS pressure"): an agent whose attempts write logs as fast as
// they can hits the daemon's per-attempt rate limit and quota; the daemon
// never buffers the excess (receiver buffers stay within their bound, the
// heap stays under floodHeapCeiling although the flood offers several times
// that), the agent counts what it dropped, and a well-behaved agent on the
// same daemon keeps its heartbeat cadence and cancel latency.
func TestDataLogFloodBounded(t *testing.T) {
	const (
		floods   = 4
		rate     = 512 << 10 // bytes/s per attempt
		burst    = 128 << 10
		quota    = 1 << 20 // bytes per attempt: reached after ~1.75 s at the rate
		duration = 2500 * time.Millisecond
	)
	const hb = 250 * time.Millisecond
	enginetest.DataBackends(t, func(t *testing.T, b enginetest.Backend) {
		// Logs go to disk (a FileSink): the sink is another subsystem and
		// must not count against the transport's heap.
		fsink, err := logs.NewFileSink(t.TempDir(), logs.FileSinkOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = fsink.Close() })
		w, _, _ := enginetest.DataWorld(t, b, func(c *daemon.Config) {
			c.LogSink = fsink
			c.Bounds.Data = daemon.DataLimits{LogRateBytes: rate, LogBurstBytes: burst, MaxAttemptLogBytes: quota}
			// A loaded 2-core CI machine under -race starves goroutines for
			// a while: liveness here is 3×250 ms.
			c.Timing.HeartbeatInterval = hb
			// Neither side may call a link dead, nor an offer expire,
			// because the shared machine starved this process for a few
			// seconds: heartbeat-ack gaps are sampled and bounded below.
			c.Timing.HeartbeatGrace = 5 * time.Second
			c.Timing.LeaseTTL = time.Minute
		})
		bad, good := w.NewIdentity(), w.NewIdentity()

		var offered, accepted, dropped, refusedWrites atomic.Int64
		chunk := bytes.Repeat([]byte("0123456789abcdef flood line of a runaway build step\n"), 1260) // ~64 KiB
		floodExec := agent.ExecutorFunc(func(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
			for ctx.Err() == nil {
				offered.Add(int64(len(chunk)))
				err := out.Log(wlogs.LogStdout, chunk)
				switch {
				case err == nil:
					accepted.Add(int64(len(chunk)))
				case errors.Is(err, logs.ErrRefused):
					refusedWrites.Add(1)
					dropped.Add(int64(len(chunk)))
					time.Sleep(time.Millisecond) // load pacing once refused, not synchronization
				default:
					dropped.Add(int64(len(chunk)))
					time.Sleep(time.Millisecond) // over the spool cap: pace the flood
				}
			}
			return agent.Result{Kind: agentwire.ResultCancelled}
		})
		floodStarted := make(chan struct{}, floods)
		badAgent, _, _ := w.StartAgent(bad, agent.ExecutorFunc(func(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
			floodStarted <- struct{}{}
			return floodExec(ctx, job, out)
		}), enginetest.SpoolIn(t.TempDir()), func(c *agent.Config) { c.LogSpoolLimit = 8 << 20; c.HeartbeatMisses = 24 })

		// The well-behaved agent: holds each attempt until cancelled.
		started := make(chan wire.JobAttemptId, 1)
		cancelled := make(chan time.Time, 1)
		goodAgent, _, _ := w.StartAgent(good, agent.ExecutorFunc(func(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
			_ = out.Log(wlogs.LogStdout, []byte("hello\n"))
			started <- job.Attempt
			<-ctx.Done()
			cancelled <- time.Now()
			return agent.Result{Kind: agentwire.ResultCancelled}
		}), enginetest.SpoolIn(t.TempDir()), func(c *agent.Config) { c.HeartbeatMisses = 24 })
		w.AwaitActive(bad.Runner)
		w.AwaitActive(good.Runner)
		ctx := context.Background()
		runtime.GC()
		baseline := liveHeap()

		var floodAttempts []wire.JobAttemptId
		for i := 0; i < floods; i++ {
			l, err := w.OfferLease(ctx, bad.Runner, enginetest.Offer(500+i))
			if err != nil {
				t.Fatal(err)
			}
			floodAttempts = append(floodAttempts, l.Attempt)
		}
		for i := 0; i < floods; i++ {
			select {
			case <-floodStarted:
			case <-time.After(10 * time.Second):
				t.Fatal("flood attempts did not start")
			}
		}

		// Sample the heap and the good agent's heartbeat acks while the
		// flood runs.
		stop := make(chan struct{})
		var maxHeap atomic.Uint64
		var gaps []time.Duration
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := goodAgent.Status().LastHeartbeatAck
			tick := time.NewTicker(2 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				if h := liveHeap(); h > maxHeap.Load() {
					maxHeap.Store(h)
				}
				if cur := goodAgent.Status().LastHeartbeatAck; cur.After(last) {
					if !last.IsZero() {
						gaps = append(gaps, cur.Sub(last))
					}
					last = cur
				}
			}
		}()
		var cancels []time.Duration
		end := time.Now().Add(duration)
		// At most 40 cancel samples: the well-behaved agent's own attempts
		// must not be what grows the heap; the flood runs until end.
		for i := 0; time.Now().Before(end) && i < 40; i++ {
			l, err := w.OfferLease(ctx, good.Runner, enginetest.Offer(600+i))
			if err != nil {
				t.Fatalf("offer %d to the well-behaved agent: %v; its stats %+v; daemon log:\n%s", i, err, goodAgent.Stats(), w.LogBuf.String())
			}
			if got := <-started; got != l.Attempt {
				t.Fatalf("started %s, want %s", got, l.Attempt)
			}
			t0 := time.Now()
			if err := w.D.CancelAttempt(ctx, l.Attempt, agentwire.CancelUserRequested); err != nil {
				t.Fatal(err)
			}
			select {
			case at := <-cancelled:
				cancels = append(cancels, at.Sub(t0))
			case <-time.After(10 * time.Second):
				t.Fatal("cancel never reached the well-behaved agent")
			}
			w.AwaitCompletion(l.Attempt, agentwire.AckAccepted)
		}
		if wait := time.Until(end); wait > 0 {
			time.Sleep(wait) // keep the flood (and the samplers) running for the whole window
		}
		close(stop)
		wg.Wait()
		for _, a := range floodAttempts {
			if err := w.D.CancelAttempt(ctx, a, agentwire.CancelUserRequested); err != nil {
				t.Fatal(err)
			}
		}
		pending := map[wire.JobAttemptId]bool{}
		for _, a := range floodAttempts {
			pending[a] = true
		}
		deadline := time.After(15 * time.Second)
		for len(pending) > 0 {
			select {
			case c := <-w.Ev.Completions:
				if pending[c.Attempt] {
					delete(pending, c.Attempt)
					t.Logf("flood attempt completed: ack %v", c.Ack)
				}
			case <-deadline:
				t.Fatalf("%d flood attempts not completed; agent %+v", len(pending), badAgent.Stats())
			}
		}

		rs := w.D.LogReceiver().Stats()
		t.Logf("%s: flood offered %d MiB (%d MiB accepted by the agent's writers, %d MiB dropped, %d refused writes); daemon appended %d MiB, %d throttle waits (%v), %d streams rejected, max buffered %d KiB",
			b.Name, offered.Load()>>20, accepted.Load()>>20, dropped.Load()>>20, refusedWrites.Load(), rs.BytesAppended>>20, rs.ThrottleWaits, rs.Throttled.Round(time.Millisecond), rs.Rejected, rs.MaxBuffered>>10)
		growth := int64(maxHeap.Load()) - int64(baseline)
		t.Logf("%s: live heap baseline %d MiB, max %d MiB (growth %d MiB, ceiling %d MiB); good agent: %d cancels p50 %v p99 %v, heartbeat-ack gaps p50 %v p99 %v (interval %v)",
			b.Name, baseline>>20, maxHeap.Load()>>20, growth>>20, floodHeapCeiling>>20, len(cancels), stats.PercentileOf(cancels, 50), stats.PercentileOf(cancels, 99), stats.PercentileOf(gaps, 50), stats.PercentileOf(gaps, 99), hb)

		if rs.ThrottleWaits == 0 {
			t.Errorf("the per-attempt rate limit never engaged")
		}
		if rs.Rejected == 0 {
			t.Errorf("no flood attempt hit the %d MiB quota", quota>>20)
		}
		if max := int64(floods) * logs.StreamBufferBound; rs.MaxBuffered > max {
			t.Errorf("receiver buffered %d bytes, bound %d", rs.MaxBuffered, max)
		}
		// The daemon stores at most quota per attempt (plus one frame).
		if limit := uint64(floods) * (quota + 2*wlogs.MaxLogChunk); rs.BytesAppended > int64(limit) {
			t.Errorf("daemon appended %d bytes, quota allows %d", rs.BytesAppended, limit)
		}
		if offered.Load() < floodHeapCeiling {
			t.Errorf("flood offered only %d MiB: not enough pressure to prove the ceiling", offered.Load()>>20)
		}
		if growth > floodHeapCeiling {
			t.Errorf("live heap grew by %d MiB, ceiling %d MiB", growth>>20, floodHeapCeiling>>20)
		}
		if dropped.Load() == 0 || badAgent.Stats().LogFinalizeFailed+int64(refusedWrites.Load()) == 0 {
			t.Errorf("the flood lost nothing visible: dropped %d, refused writes %d", dropped.Load(), refusedWrites.Load())
		}
		if len(cancels) == 0 {
			t.Errorf("only %d cancels measured", len(cancels))
		} else if n := beyond(cancels, time.Second); n > 1 {
			t.Errorf("%d of the well-behaved agent's cancels over 1 s under the flood, want at most one outlier", n)
		}
		if len(gaps) < 2 {
			t.Errorf("only %d heartbeat acks for the well-behaved agent during the flood", len(gaps))
		} else if n := beyond(gaps, 4*hb-1); n > 1 {
			t.Errorf("%d of the well-behaved agent's heartbeat-ack gaps ≥ 4 intervals, want at most one outlier", n)
		}
		if r := goodAgent.Stats().Reconnects; r != 0 {
			t.Errorf("well-behaved agent reconnected %d times", r)
		}
	})
}
