package daemon_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
	wcas "forgeyard.dev/transport/wire/cas"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// TestLogStreamAuthorityOutageRetryable (issue 27 item 4): a log stream
// opened while the authority fails is reset with StreamInternalError (the
// agent retries it), not StreamForbidden (on which it would give the log
// up); a stream for a lease the authority does not know is Forbidden.
func TestLogStreamAuthorityOutageRetryable(t *testing.T) {
	var leaky *leakyAuthority
	w, _, _ := enginetest.DataWorld(t, enginetest.MemoryBackend(), func(c *daemon.Config) {
		leaky = &leakyAuthority{Authority: c.Authority}
		c.Authority = leaky
	})
	id := w.NewIdentity()
	rc := w.DialRaw(id)
	rc.Join(wire.NewAgentSessionId())
	w.AwaitActive(id.Runner)

	resetCode := func() semantics.StreamErrorCode {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := rc.Sc.OpenUniStream(ctx, wire.StreamLog)
		if err != nil {
			t.Fatal(err)
		}
		hdr := &wlogs.LogStreamHeaderV1{Attempt: wire.NewJobAttemptId(), Lease: wire.NewLeaseId(), FirstSeq: 1, Encoding: wlogs.LogEncodingRaw}
		err = s.WriteEnvelope(&wire.Envelope{Protocol: wire.Current, MessageID: wire.NewMessageId(), Payload: hdr})
		// The reset arrives as the answer to a write; keep writing until it does.
		for seq := uint64(1); err == nil && ctx.Err() == nil; seq++ {
			err = s.WriteEnvelope(&wire.Envelope{Protocol: wire.Current, MessageID: wire.NewMessageId(),
				Payload: &wlogs.LogFrameV1{Seq: seq, Bytes: []byte("x"), UncompressedLen: 1}})
		}
		var se *semantics.StreamError
		if !errors.As(err, &se) {
			t.Fatalf("log stream not reset: %v", err)
		}
		return se.Code
	}
	leaky.failing.Store(true)
	if c := resetCode(); c != semantics.StreamInternalError {
		t.Fatalf("authority down: log stream reset with %s, want %s (retryable)", c, semantics.StreamInternalError)
	}
	leaky.failing.Store(false)
	if c := resetCode(); c != semantics.StreamForbidden {
		t.Fatalf("unknown lease: log stream reset with %s, want %s", c, semantics.StreamForbidden)
	}
}

// TestDataBarriersAuthorityOutageRetryable (issue 27 item 4): the
// logs-finalized and outputs-finalized barriers sent while the authority
// fails are answered Internal/RetryBackoff with the safe text (the agent
// retries them), never Forbidden; for a lease the authority does not know
// they are Forbidden/RetryNever.
func TestDataBarriersAuthorityOutageRetryable(t *testing.T) {
	var leaky *leakyAuthority
	w, _, _ := enginetest.DataWorld(t, enginetest.MemoryBackend(), func(c *daemon.Config) {
		leaky = &leakyAuthority{Authority: c.Authority}
		c.Authority = leaky
	})
	id := w.NewIdentity()
	rc := w.DialRaw(id)
	rc.Join(wire.NewAgentSessionId())
	w.AwaitActive(id.Runner)
	answer := func(m wire.Message) *wire.WireErrorV1 {
		t.Helper()
		env, err := rc.Call(m)
		var we *wire.WireErrorV1
		switch {
		case errors.As(err, &we):
		case err == nil:
			var ok bool
			if we, ok = env.Payload.(*wire.WireErrorV1); !ok {
				t.Fatalf("%T answered with %T, want an error", m, env.Payload)
			}
		default:
			t.Fatalf("%T: %v", m, err)
		}
		return we
	}
	for _, m := range []wire.Message{
		&wlogs.LogsFinalizedV1{Attempt: wire.NewJobAttemptId(), Lease: wire.NewLeaseId(), LastSeq: 1},
		&wcas.OutputsFinalizedV1{Attempt: wire.NewJobAttemptId(), Lease: wire.NewLeaseId()},
	} {
		leaky.failing.Store(true)
		if we := answer(m); we.Code != wire.ErrCodeInternal || we.Retry != wire.RetryBackoff {
			t.Errorf("%T with the authority down: %s/%s %q, want Internal/Backoff", m, we.Code, we.Retry, we.Message)
		}
		leaky.failing.Store(false)
		if we := answer(m); we.Code != wire.ErrCodeForbidden || we.Retry != wire.RetryNever {
			t.Errorf("%T for an unknown lease: %s/%s, want Forbidden/Never", m, we.Code, we.Retry)
		}
	}
}
