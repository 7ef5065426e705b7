package control_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// pair returns two channels joined by a memory connection; the server side
// answers heartbeats (unless mute) and forwards everything else to got.
func pair(t *testing.T, cfg control.Config, mute bool) (client *control.Channel, server *control.Channel, got chan *wire.Envelope, bad chan *control.DecodeError, cs *semantics.Stream) {
	t.Helper()
	st, ss := controlStreams(t)
	client = control.New(st, cfg)
	server = control.New(ss, control.Config{})
	got = make(chan *wire.Envelope, 64)
	bad = make(chan *control.DecodeError, 64)
	go func() { _ = client.Run(func(e *wire.Envelope) { got <- e }, func(d *control.DecodeError) { bad <- d }) }()
	go func() {
		_ = server.Run(func(e *wire.Envelope) {
			if hb, ok := e.Payload.(*agentwire.HeartbeatV1); ok && !mute {
				_ = server.Reply(e, &agentwire.HeartbeatAckV1{Seq: hb.Seq, ServerTimeMs: 1})
				return
			}
			got <- e
		}, func(d *control.DecodeError) { bad <- d })
	}()
	return client, server, got, bad, st
}

// controlStreams returns the two ends of a control stream over a memory
// connection (closed at cleanup).
func controlStreams(t *testing.T) (opened, accepted *semantics.Stream) {
	t.Helper()
	c, s := memory.Pipe(memory.Options{})
	t.Cleanup(func() { _ = c.CloseWithCode(wire.CloseNormal, ""); _ = s.CloseWithCode(wire.CloseNormal, "") })
	cc, _ := semantics.NewConn(c, semantics.Config{})
	sc, _ := semantics.NewConn(s, semantics.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := cc.OpenStream(ctx, wire.StreamControl)
	if err != nil {
		t.Fatal(err)
	}
	ss, err := sc.AcceptStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st, ss
}

func hb(seq uint64) *agentwire.HeartbeatV1 {
	return &agentwire.HeartbeatV1{Runner: wire.NewRunnerId(), Session: wire.NewAgentSessionId(), Seq: seq,
		CapabilityDigest: wire.CapabilityDigest{Digest: wire.Digest{1}}}
}

func TestCallCorrelates(t *testing.T) {
	client, _, _, _, _ := pair(t, control.Config{}, false)
	for i := uint64(1); i <= 20; i++ {
		env, err := client.Call(context.Background(), control.Out{Msg: hb(i)}, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		ack := env.Payload.(*agentwire.HeartbeatAckV1)
		if ack.Seq != i || !env.HasCorrelation {
			t.Fatalf("answer %+v", ack)
		}
	}
}

func TestCallTimeoutAndErrors(t *testing.T) {
	client, server, got, _, _ := pair(t, control.Config{MaxPending: 1}, true)
	_, err := client.Call(context.Background(), control.Out{Msg: hb(1)}, 30*time.Millisecond)
	var te *control.TimeoutError
	if !errors.As(err, &te) || te.Code() != wire.ErrCodeTimeout || te.Type != agentwire.MsgHeartbeat {
		t.Fatalf("got %v, want TimeoutError", err)
	}
	<-got
	// Bounded: with MaxPending 1 a second concurrent call is refused.
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		close(started)
		_, err := client.Call(context.Background(), control.Out{Msg: hb(2)}, 2*time.Second)
		done <- err
	}()
	<-started
	e := <-got // the first call is outstanding now
	if _, err := client.Call(context.Background(), control.Out{Msg: hb(3)}, time.Second); !errors.Is(err, control.ErrTooManyPending) {
		t.Fatalf("second call: %v", err)
	}
	// A WireErrorV1 answer is returned as the error.
	if err := server.ReplyError(e.MessageID, wire.ErrCodeStaleLease, wire.RetryNever, "stale"); err != nil {
		t.Fatal(err)
	}
	err = <-done
	var we *wire.WireErrorV1
	if !errors.As(err, &we) || we.Code != wire.ErrCodeStaleLease {
		t.Fatalf("got %v", err)
	}
}

func TestRetryKeepsMessageID(t *testing.T) {
	client, _, got, _, _ := pair(t, control.Config{}, true)
	id := wire.NewMessageId()
	for i := 0; i < 2; i++ {
		if _, err := client.Send(control.Out{ID: id, Msg: hb(1)}); err != nil {
			t.Fatal(err)
		}
		if e := <-got; e.MessageID != id {
			t.Fatalf("retry %d used %s", i, e.MessageID)
		}
	}
}

func TestPriorityPerWrite(t *testing.T) {
	client, _, got, _, st := pair(t, control.Config{}, true)
	if _, err := client.Send(control.Out{Msg: hb(1), Priority: semantics.PriorityCancel, UsePriority: true}); err != nil {
		t.Fatal(err)
	}
	<-got
	if p := st.Priority(); p != semantics.PriorityControl {
		t.Fatalf("stream priority left at %s", p)
	}
}

func TestBadFramesReported(t *testing.T) {
	_, server, _, bad, st := pair(t, control.Config{}, true)
	_ = server
	id := wire.NewMessageId()
	// A heartbeat that decodes but fails validation (zero runner).
	env := wire.Envelope{Protocol: wire.Current, MessageID: id, Payload: &agentwire.HeartbeatV1{}}
	if err := st.WriteEnvelope(&env); err != nil {
		t.Fatal(err)
	}
	// Garbage.
	if err := st.WriteFrame(func(b []byte) []byte { return append(b, 0xff, 0xff) }); err != nil {
		t.Fatal(err)
	}
	d1, d2 := <-bad, <-bad
	if d1.Code != wire.ErrCodeInvalidValue || !d1.HasID || d1.MessageID != id {
		t.Fatalf("invalid message reported as %+v", d1)
	}
	if d2.Code != wire.ErrCodeMalformed || d2.HasID {
		t.Fatalf("garbage reported as %+v", d2)
	}
}

func TestClosedChannel(t *testing.T) {
	client, _, _, _, st := pair(t, control.Config{}, true)
	st.CancelRead(semantics.StreamCancelled)
	<-client.Done()
	if !errors.Is(client.Err(), control.ErrClosed) {
		t.Fatalf("Err %v", client.Err())
	}
	if _, err := client.Call(context.Background(), control.Out{Msg: hb(1)}, time.Second); !errors.Is(err, control.ErrClosed) {
		t.Fatalf("Call after close: %v", err)
	}
}
