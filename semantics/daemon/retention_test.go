package daemon_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/semantics/telemetry"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// TestRetentionKeepsLiveAttempts (issue 15 item 5): the daemon's
// collection deletes the log and output of a finished attempt older than
// max_age and keeps the log and payload of the attempt still running, and
// reports held and deleted bytes in its metrics.
func TestRetentionKeepsLiveAttempts(t *testing.T) {
	dir := t.TempDir()
	sink, err := logs.NewFileSink(filepath.Join(dir, "logs"), logs.FileSinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	store, err := cas.NewFSStore(cas.FSStoreConfig{Dir: filepath.Join(dir, "cas")})
	if err != nil {
		t.Fatal(err)
	}
	metrics := telemetry.NewMetrics()
	w := enginetest.NewWorld(t, enginetest.MemoryBackend(), func(c *daemon.Config) {
		c.LogSink, c.ContentStore, c.Metrics = sink, store, metrics
		// Collected on demand below (CollectGarbage); Interval keeps the
		// background run out of the way.
		c.Retention = daemon.Retention{MaxAge: time.Nanosecond, Interval: time.Hour}
	})
	payload := enginetest.PutObject(t, store, []byte("the payload of the running attempt"))
	hold := make(chan struct{})
	exec := agent.ExecutorFunc(func(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
		_ = out.Log(wlogs.LogStdout, []byte(fmt.Sprintf("log of %s\n", job.Attempt)))
		if job.Payload == payload {
			select {
			case <-hold:
			case <-ctx.Done():
			}
			return agent.Result{Kind: agentwire.ResultSucceeded}
		}
		if _, err := out.PutOutput([]byte("the output of the finished attempt")); err != nil {
			return agent.Result{Kind: agentwire.ResultInfraError}
		}
		return agent.Result{Kind: agentwire.ResultSucceeded}
	})
	id := w.NewIdentity()
	w.StartAgent(id, exec, enginetest.SpoolIn(t.TempDir()))
	w.AwaitActive(id.Runner)
	ctx := context.Background()
	done, err := w.D.OfferLease(ctx, id.Runner, enginetest.Offer(51))
	if err != nil {
		t.Fatal(err)
	}
	w.AwaitCompletion(done.Attempt, agentwire.AckAccepted)
	outs, _ := w.D.FinalizedOutputs(done.Attempt)
	if len(outs) != 1 {
		t.Fatalf("outputs %v", outs)
	}
	o := enginetest.Offer(52)
	o.Payload = payload
	running, err := w.D.OfferLease(ctx, id.Runner, o)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for sink.Durable(running.Attempt) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the running attempt's log never became durable")
		}
		time.Sleep(2 * time.Millisecond) // acks are periodic; no event to await here
	}
	res, err := w.D.CollectGarbage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := sink.Durable(done.Attempt); d != 0 {
		t.Errorf("the finished attempt's log survived (durable %d)", d)
	}
	if st, _ := store.Stat(outs[0]); st.Complete {
		t.Error("the finished attempt's output survived")
	}
	if sink.Durable(running.Attempt) == 0 {
		t.Error("the running attempt's log was deleted")
	}
	if st, _ := store.Stat(payload); !st.Complete {
		t.Error("the running attempt's payload was deleted")
	}
	if res.DeletedLogs != 1 || res.DeletedObjs != 1 || res.CASBytes != int64(payload.Size) {
		t.Errorf("result %+v", res)
	}
	if v := counter(t, metrics, "forgeyard_data_retention_deleted_bytes_total", map[string]string{"store": "cas"}); v != float64(outs[0].Size) {
		t.Errorf("deleted cas bytes metric %v, want %d", v, outs[0].Size)
	}
	close(hold)
	w.AwaitCompletion(running.Attempt, agentwire.AckAccepted)
}
