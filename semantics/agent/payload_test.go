package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// TestDataPayloadFetch (§87–93): with FetchPayload the agent downloads the
// lease's payload from the daemon's store and verifies it before the
// executor starts, which reads exactly the stored bytes; a payload the
// daemon does not hold ends the attempt InfraError without running it; and
// the daemon serves a lease only its own payload (the executor cannot
// fetch another lease's).
func TestDataPayloadFetch(t *testing.T) {
	enginetest.DataBackends(t, func(t *testing.T, b enginetest.Backend) {
		w, _, store := enginetest.DataWorld(t, b)
		id := w.NewIdentity()
		payload := bytes.Repeat([]byte("forgeyard payload\n"), 200_000) // 3.4 MiB
		ref := enginetest.PutObject(t, store, payload)
		got := make(chan []byte, 2)
		ran := make(chan wire.JobAttemptId, 4)
		exec := agent.ExecutorFunc(func(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
			ran <- job.Attempt
			rc, err := job.OpenPayload()
			if err != nil {
				return agent.Result{Kind: agentwire.ResultInfraError, Message: err.Error()}
			}
			defer rc.Close()
			b, err := io.ReadAll(rc)
			if err != nil {
				return agent.Result{Kind: agentwire.ResultInfraError, Message: err.Error()}
			}
			got <- b
			return agent.Result{Kind: agentwire.ResultSucceeded}
		})
		a, _, _ := w.StartAgent(id, exec, enginetest.SpoolIn(t.TempDir()), func(c *agent.Config) { c.FetchPayload = true })
		w.AwaitActive(id.Runner)
		ctx := context.Background()

		o := enginetest.Offer(900)
		o.Payload = ref
		l, err := w.D.OfferLease(ctx, id.Runner, o)
		if err != nil {
			t.Fatal(err)
		}
		c := w.AwaitCompletion(l.Attempt, agentwire.AckAccepted)
		if c.Result.Kind != agentwire.ResultSucceeded {
			t.Fatalf("attempt ended %v: %s", c.Result.Kind, c.Result.Message)
		}
		if b := <-got; !bytes.Equal(b, payload) {
			t.Fatalf("executor read %d bytes, not the %d-byte payload", len(b), len(payload))
		}
		if <-ran != l.Attempt {
			t.Fatal("wrong attempt ran")
		}

		// A payload the daemon does not hold: the attempt never runs.
		o = enginetest.Offer(901)
		o.Payload = wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: wire.Digest{9, 9, 9}, Size: 1234}
		l, err = w.D.OfferLease(ctx, id.Runner, o)
		if err != nil {
			t.Fatal(err)
		}
		c = w.AwaitCompletion(l.Attempt, agentwire.AckAccepted)
		if c.Result.Kind != agentwire.ResultInfraError || !strings.Contains(c.Result.Message, "payload download failed") {
			t.Fatalf("missing payload: attempt ended %v %q", c.Result.Kind, c.Result.Message)
		}
		select {
		case att := <-ran:
			t.Fatalf("attempt %s ran without its payload", att)
		default:
		}
		if st := a.Stats(); st.PayloadsFetched != 1 || st.PayloadsFailed != 1 {
			t.Fatalf("payload stats %d fetched / %d failed, want 1/1", st.PayloadsFetched, st.PayloadsFailed)
		}
	})
}

// slowStore serves downloads slowly (a pause before every read), so a
// payload transfer lasts much longer than the agent's retry pauses.
type slowStore struct {
	*cas.FSStore
	pause time.Duration
}

func (s slowStore) Open(ref wire.CasObjectRef, off uint64) (io.ReadCloser, error) {
	rc, err := s.FSStore.Open(ref, off)
	if err != nil {
		return nil, err
	}
	return slowReader{rc, s.pause}, nil
}

type slowReader struct {
	io.ReadCloser
	pause time.Duration
}

func (r slowReader) Read(p []byte) (int, error) {
	time.Sleep(r.pause) // simulated slow disk, not synchronization
	return r.ReadCloser.Read(p)
}

// TestDataPayloadShared: several attempts of one agent name the same
// payload at once; one downloads it while the others find its transfer in
// progress (cas.ErrBusy) and wait for it — for as long as the transfer
// takes, not a fixed number of retries — so every attempt runs with the
// verified payload.
func TestDataPayloadShared(t *testing.T) {
	b := enginetest.MemoryBackend()
	// The slow store wraps the world's own, before the daemon starts (its
	// health prober uses the store from the start).
	w, _, store := enginetest.DataWorld(t, b, func(c *daemon.Config) {
		c.ContentStore = &slowStore{FSStore: c.ContentStore.(*cas.FSStore), pause: 40 * time.Millisecond}
	})
	payload := bytes.Repeat([]byte("shared payload\n"), 70_000) // 1 MiB: ≥ 16 reads of 64 KiB, ≥ 640 ms
	ref := enginetest.PutObject(t, store, payload)
	exec := agent.ExecutorFunc(func(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
		rc, err := job.OpenPayload()
		if err != nil {
			return agent.Result{Kind: agentwire.ResultInfraError, Message: err.Error()}
		}
		defer rc.Close()
		got, err := io.ReadAll(rc)
		if err != nil || !bytes.Equal(got, payload) {
			return agent.Result{Kind: agentwire.ResultInfraError, Message: fmt.Sprintf("payload: %d bytes, %v", len(got), err)}
		}
		return agent.Result{Kind: agentwire.ResultSucceeded}
	})
	id := w.NewIdentity()
	a, _, _ := w.StartAgent(id, exec, enginetest.SpoolIn(t.TempDir()), func(c *agent.Config) { c.FetchPayload = true })
	w.AwaitActive(id.Runner)
	want := map[wire.JobAttemptId]bool{}
	for i := range 3 {
		o := enginetest.Offer(950 + i)
		o.Payload = ref
		l, err := w.D.OfferLease(context.Background(), id.Runner, o)
		if err != nil {
			t.Fatal(err)
		}
		want[l.Attempt] = true
	}
	deadline := time.After(20 * time.Second)
	for len(want) > 0 {
		select {
		case c := <-w.Ev.Completions:
			if !want[c.Attempt] || c.Ack != agentwire.AckAccepted {
				continue
			}
			if c.Result.Kind != agentwire.ResultSucceeded {
				t.Fatalf("attempt %s ended %v: %s", c.Attempt, c.Result.Kind, c.Result.Message)
			}
			delete(want, c.Attempt)
		case <-deadline:
			t.Fatalf("%d attempts did not complete", len(want))
		}
	}
	if st := a.Stats(); st.PayloadsFetched != 3 || st.PayloadsFailed != 0 {
		t.Fatalf("payload stats %d fetched / %d failed, want 3/0", st.PayloadsFetched, st.PayloadsFailed)
	}
}
