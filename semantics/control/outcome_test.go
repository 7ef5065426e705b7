package control_test

import (
	"context"
	"testing"
	"time"

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
