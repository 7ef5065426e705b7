package control_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// messagesTotal reads forgeyard_transport_messages_total{family,outcome}.
func messagesTotal(t *testing.T, m *telemetry.Metrics, family, outcome string) float64 {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "forgeyard_transport_messages_total" {
			continue
		}
	next:
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if (l.GetName() == "family" && l.GetValue() != family) || (l.GetName() == "outcome" && l.GetValue() != outcome) {
					continue next
				}
			}
			return s.GetCounter().GetValue()
		}
	}
	return 0
}

// TestMessageOutcomes: a handled message counts ok unless its handler says
// rejected (SetOutcome) or decides later (DeferOutcome: counted once, when
// the returned function is called, with the outcome given then).
func TestMessageOutcomes(t *testing.T) {
	st, ss := controlStreams(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m := telemetry.NewMetrics()
	sender := control.New(st, control.Config{})
	recv := control.New(ss, control.Config{Metrics: m})
	later := make(chan func(telemetry.Outcome), 1)
	handled := make(chan uint64, 8)
	release := make(chan struct{})
	defer close(release)
	go func() {
		_ = recv.Run(func(e *wire.Envelope) {
			n := e.Payload.(*agentwire.HeartbeatV1).Seq
			switch n {
			case 2:
				recv.SetOutcome(telemetry.OutcomeRejected)
			case 3:
				later <- recv.DeferOutcome(e.Payload.MessageType())
			}
			handled <- n
			if n == 5 {
				<-release // hb(5) is counted only after the test has read the counters
			}
		}, nil)
	}()
	for i := uint64(1); i <= 3; i++ {
		if _, err := sender.SendMsg(hb(i)); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		select {
		case <-handled:
		case <-ctx.Done():
			t.Fatal("messages not handled")
		}
	}
	count := <-later
	// Run counts a message after its handler returns: once hb(n+1) is
	// handled, hb(n) is counted.
	sync := func(n uint64) {
		if _, err := sender.SendMsg(hb(n)); err != nil {
			t.Fatal(err)
		}
		if got := <-handled; got != n {
			t.Fatalf("handled %d, want %d", got, n)
		}
	}
	sync(4)
	fam := "agent"
	if got := messagesTotal(t, m, fam, "duplicate"); got != 0 {
		t.Fatalf("deferred message counted before its outcome was known: duplicate = %v", got)
	}
	count(telemetry.OutcomeDuplicate)
	count(telemetry.OutcomeOK) // a second call does nothing
	sync(5)                    // hb(4) is counted now
	for _, c := range []struct {
		outcome string
		want    float64
	}{{"ok", 2}, {"rejected", 1}, {"duplicate", 1}} {
		if got := messagesTotal(t, m, fam, c.outcome); got != c.want {
			t.Errorf("outcome %s = %v, want %v", c.outcome, got, c.want)
		}
	}
}

// nilPanics fails the test on any hook call: it stands for an observer
// whose methods are not safe on a nil receiver.
type nilPanics struct{}

func (*nilPanics) MessageHandled(wire.Family, semantics.Outcome) {
	panic("hook called on a nil *nilPanics")
}
func (*nilPanics) ProtocolError(wire.ProtocolErrorCode) { panic("hook called on a nil *nilPanics") }

// TestNilPointerMetricsIsNoObserver: a nil pointer stored in
// Config.Metrics (a nil *telemetry.Metrics, or any nil observer) means no
// observer: messages, undecodable frames, WireErrorV1 and deferred
// outcomes are handled and no hook is called.
func TestNilPointerMetricsIsNoObserver(t *testing.T) {
	for _, o := range []semantics.MessageObserver{(*nilPanics)(nil), (*telemetry.Metrics)(nil)} {
		t.Run(fmt.Sprintf("%T", o), func(t *testing.T) {
			if o == nil {
				t.Fatal("the test needs a non-nil interface holding a nil pointer")
			}
			st, ss := controlStreams(t)
			sender := control.New(st, control.Config{})
			recv := control.New(ss, control.Config{Metrics: o})
			handled := make(chan wire.MessageTypeId, 8)
			bad := make(chan *control.DecodeError, 1)
			go func() {
				_ = recv.Run(func(e *wire.Envelope) {
					if e.Payload.MessageType() == wire.MsgError {
						recv.SetOutcome(semantics.OutcomeRejected)
					} else {
						recv.DeferOutcome(e.Payload.MessageType())(semantics.OutcomeDuplicate)
					}
					handled <- e.Payload.MessageType()
				}, func(d *control.DecodeError) { bad <- d })
			}()
			if _, err := sender.SendMsg(hb(1)); err != nil {
				t.Fatal(err)
			}
			if err := st.WriteFrame(func(p []byte) []byte { return append(p, 0xff, 0xff, 0xff) }); err != nil {
				t.Fatal(err)
			}
			if _, err := sender.SendMsg(&wire.WireErrorV1{Code: wire.ErrCodeMalformed, Message: "x"}); err != nil {
				t.Fatal(err)
			}
			timeout := time.After(5 * time.Second)
			for _, want := range []wire.MessageTypeId{hb(1).MessageType(), wire.MsgError} {
				select {
				case got := <-handled:
					if got != want {
						t.Fatalf("handled %v, want %v", got, want)
					}
				case <-timeout:
					t.Fatal("messages not handled")
				}
			}
			select {
			case <-bad:
			case <-timeout:
				t.Fatal("undecodable frame not reported")
			}
		})
	}
}
