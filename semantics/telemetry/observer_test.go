package telemetry_test

import (
	"bytes"
	"context"
	"io"
	"slices"
	"testing"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
)

// TestHandshakeFailureReasonsMatchTelemetry: the metric's and the audit
// record's closed reason set is exactly semantics.HandshakeFailureReasons.
// (It lived in package semantics, which no longer imports telemetry.)
func TestHandshakeFailureReasonsMatchTelemetry(t *testing.T) {
	var got []string
	for _, r := range semantics.HandshakeFailureReasons() {
		got = append(got, string(r))
	}
	if !slices.Equal(got, telemetry.HandshakeFailureReasons) {
		t.Fatalf("semantics %v != telemetry %v", got, telemetry.HandshakeFailureReasons)
	}
}

// TestMetricsObserveConn: *Metrics as a Conn's observer (Config.Metrics)
// exports its streams, bytes and queue depth under the §207 names.
func TestMetricsObserveConn(t *testing.T) {
	for _, m := range []*telemetry.Metrics{telemetry.NewMetrics(), nil} {
		bc, bs := memory.Pipe(memory.Options{})
		c, err := semantics.NewConn(bc, semantics.Config{Metrics: m})
		if err != nil {
			t.Fatal(err)
		}
		s, err := semantics.NewConn(bs, semantics.Config{Metrics: m})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		ls, err := c.OpenUniStream(ctx, wire.StreamLog)
		if err != nil {
			t.Fatal(err)
		}
		lr, err := s.AcceptUniStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m != nil {
			fams := parse(t, scrape(t, m.Handler()))
			if got := value(t, fams, "forgeyard_transport_streams_active", map[string]string{"kind": "log"}); got != 2 {
				t.Errorf("streams_active{kind=log} = %v with both ends open, want 2", got)
			}
		}
		body := bytes.Repeat([]byte("z"), 100<<10)
		done := make(chan error, 1)
		go func() {
			_, err := ls.Write(body)
			if cerr := ls.Close(); err == nil {
				err = cerr
			}
			done <- err
		}()
		got, err := io.ReadAll(lr)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("read %d bytes, %v", len(got), err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		_ = c.CloseWithCode(wire.CloseNormal, "")
		_ = s.CloseWithCode(wire.CloseNormal, "")
		if m == nil {
			continue // a nil *Metrics is no observer: nothing to read, nothing panicked
		}
		fams := parse(t, scrape(t, m.Handler()))
		for _, c := range []struct {
			name   string
			labels map[string]string
			want   float64
		}{
			{"forgeyard_transport_streams_active", map[string]string{"kind": "log"}, 0},
			{"forgeyard_transport_received_bytes_total", map[string]string{"kind": "log"}, float64(len(body))},
			{"forgeyard_transport_log_queue_bytes", nil, 0},
			{"forgeyard_transport_control_queue_bytes", nil, 0},
		} {
			if got := value(t, fams, c.name, c.labels); got != c.want {
				t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
			}
		}
		if got := value(t, fams, "forgeyard_transport_sent_bytes_total", map[string]string{"kind": "log"}); got < float64(len(body)) {
			t.Errorf("sent_bytes_total{kind=log} = %v, want ≥ %d", got, len(body))
		}
	}
}

// TestNilMetricsIsNoObserver: a nil *Metrics stored in either observer
// interface is the typed-nil case semantics treats as no observer.
func TestNilMetricsIsNoObserver(t *testing.T) {
	var m *telemetry.Metrics
	// Non-nil interfaces holding a nil pointer.
	var o semantics.Observer = m
	var mo semantics.MessageObserver = m
	if !semantics.IsNilObserver(o) || !semantics.IsNilObserver(mo) {
		t.Fatal("IsNilObserver(nil *Metrics) = false")
	}
	if semantics.IsNilObserver(semantics.Observer(telemetry.NewMetrics())) {
		t.Fatal("IsNilObserver(NewMetrics()) = true")
	}
	// Its methods stay safe on the nil receiver for callers holding the
	// pointer itself (engines: m.ConnOpened, ...); TestMetricsNilIsNoop
	// covers every method.
	o.QueueAdd(semantics.ClassLog, 1)
	mo.MessageHandled(wire.FamilyAgent, semantics.OutcomeOK)
}

// TestQueueAndOutcomeAreSemantics: the label types are the contract's, and
// their labels are unchanged.
func TestQueueAndOutcomeAreSemantics(t *testing.T) {
	var q telemetry.Queue = semantics.ClassCAS
	var o telemetry.Outcome = semantics.OutcomeRejected
	if q != telemetry.QueueCas || o != telemetry.OutcomeRejected {
		t.Fatal("aliases differ")
	}
	for o, want := range map[telemetry.Outcome]string{telemetry.OutcomeOK: "ok", telemetry.OutcomeError: "error",
		telemetry.OutcomeRejected: "rejected", telemetry.OutcomeDuplicate: "duplicate", telemetry.Outcome(50): "unknown"} {
		if o.String() != want {
			t.Errorf("Outcome(%d).String() = %q, want %q", o, o.String(), want)
		}
	}
}
