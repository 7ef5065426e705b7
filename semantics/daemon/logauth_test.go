package daemon_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/enginetest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
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
