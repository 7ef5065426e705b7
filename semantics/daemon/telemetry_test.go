package daemon_test

import (
	"context"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/internal/testkit/metricstest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// telemetryRun is one daemon and one agent over loopback QUIC, both with
// Metrics and Tracing (in-memory exporter), FeatureTraceContextV1 offered
// on both sides. It runs two leases: spec(1) logs a line, uploads an
// output and succeeds; spec(2) waits until the daemon cancels it.
type telemetryRun struct {
	w              *enginetest.World
	dm, am         *telemetry.Metrics
	exp            *tracetest.InMemoryExporter
	dtr, atr       *telemetry.Tracing
	done, canceled daemon.CompletionEvent
	doneLease      wire.LeaseId
}

func runTelemetry(t *testing.T) *telemetryRun {
	t.Helper()
	r := &telemetryRun{dm: telemetry.NewMetrics(), am: telemetry.NewMetrics(), exp: tracetest.NewInMemoryExporter()}
	r.dtr = telemetry.NewTracing(telemetry.TracingConfig{ServiceName: "forgeyard-daemon", Exporter: r.exp, Synchronous: true})
	r.atr = telemetry.NewTracing(telemetry.TracingConfig{ServiceName: "forgeyard-agent", Exporter: r.exp, Synchronous: true})
	t.Cleanup(func() { _ = r.dtr.Shutdown(context.Background()); _ = r.atr.Shutdown(context.Background()) })
	sink := &logs.MemorySink{}
	store := newStore(t)
	traced := wire.Features(wire.FeatureTraceContextV1)
	r.w = enginetest.NewWorld(t, enginetest.QuicBackend(), func(c *daemon.Config) {
		c.LogSink, c.ContentStore, c.Metrics, c.Tracing, c.Features = sink, store, r.dm, r.dtr, traced
	})
	id := r.w.NewIdentity()
	started := make(chan wire.JobAttemptId, 1)
	exec := agent.ExecutorFunc(func(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
		if job.Spec == enginetest.Spec(2) {
			started <- job.Attempt
			<-ctx.Done()
			return agent.Result{Kind: agentwire.ResultCancelled}
		}
		if err := out.Log(wlogs.LogStdout, []byte("building forgeyard\n")); err != nil {
			return agent.Result{Kind: agentwire.ResultInfraError, Message: err.Error()}
		}
		if _, err := out.PutOutput(agent.SyntheticOutput(job.Spec, 64<<10)); err != nil {
			return agent.Result{Kind: agentwire.ResultInfraError, Message: err.Error()}
		}
		return agent.Result{Kind: agentwire.ResultSucceeded}
	})
	r.w.StartAgent(id, exec, enginetest.SpoolIn(t.TempDir()), func(c *agent.Config) {
		c.Metrics, c.Tracing, c.Features = r.am, r.atr, traced
	})
	r.w.AwaitActive(id.Runner)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := r.w.D.OfferLease(ctx, id.Runner, enginetest.Offer(1))
	if err != nil {
		t.Fatal(err)
	}
	r.doneLease = l.ID
	r.done = r.w.AwaitCompletion(l.Attempt, agentwire.AckAccepted)
	l2, err := r.w.D.OfferLease(ctx, id.Runner, enginetest.Offer(2))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("second attempt never started")
	}
	if err := r.w.D.CancelAttempt(ctx, l2.Attempt, agentwire.CancelUserRequested); err != nil {
		t.Fatal(err)
	}
	r.canceled = r.w.AwaitCompletion(l2.Attempt, agentwire.AckAccepted)
	// At least one heartbeat round trip (interval 100 ms): wait for the
	// agent's histogram to have a sample (no event marks it).
	deadline := time.Now().Add(5 * time.Second)
	for histCount(t, r.am, "forgeyard_heartbeat_rtt_seconds") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no heartbeat round trip observed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return r
}

func newStore(t *testing.T) *cas.FSStore {
	t.Helper()
	store, err := cas.NewFSStore(cas.FSStoreConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return store
}

func histCount(t *testing.T, m *telemetry.Metrics, name string) float64 {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			var n float64
			for _, s := range f.GetMetric() {
				n += float64(s.GetHistogram().GetSampleCount())
			}
			return n
		}
	}
	return 0
}

// TestMetricsFedByEngines: a real daemon and agent over loopback QUIC run
// a job with a log line and an output, and a cancelled one; both /metrics
// scrapes show non-zero values in every family the engines feed, queue
// gauges never go negative, and promtool accepts both expositions.
func TestMetricsFedByEngines(t *testing.T) {
	r := runTelemetry(t)
	dtext, d := enginetest.ScrapeFamilies(t, r.dm)
	atext, a := enginetest.ScrapeFamilies(t, r.am)
	type check struct {
		fams   map[string]*dto.MetricFamily
		side   string
		name   string
		labels []string
	}
	checks := []check{
		{d, "daemon", "forgeyard_transport_received_bytes_total", []string{"kind", "control"}},
		{d, "daemon", "forgeyard_transport_sent_bytes_total", []string{"kind", "control"}},
		{d, "daemon", "forgeyard_transport_received_bytes_total", []string{"kind", "log"}},
		{d, "daemon", "forgeyard_transport_received_bytes_total", []string{"kind", "cas-upload"}},
		{d, "daemon", "forgeyard_transport_streams_active", []string{"kind", "control"}},
		{d, "daemon", "forgeyard_transport_messages_total", []string{"family", "agent", "outcome", "ok"}},
		{d, "daemon", "forgeyard_lease_offer_to_ack_seconds", nil},
		{d, "daemon", "forgeyard_completion_ack_seconds", nil},
		{d, "daemon", "forgeyard_cancel_delivery_seconds", nil},
		{d, "daemon", "forgeyard_log_bytes_total", []string{"side", "daemon"}},
		{d, "daemon", "forgeyard_log_frames_total", []string{"side", "daemon"}},
		{d, "daemon", "forgeyard_cas_bytes_total", []string{"direction", "upload"}},
		{d, "daemon", "forgeyard_cas_objects_total", []string{"direction", "upload"}},
		{a, "agent", "forgeyard_transport_sent_bytes_total", []string{"kind", "control"}},
		{a, "agent", "forgeyard_transport_sent_bytes_total", []string{"kind", "log"}},
		{a, "agent", "forgeyard_transport_sent_bytes_total", []string{"kind", "cas-upload"}},
		{a, "agent", "forgeyard_transport_streams_active", []string{"kind", "control"}},
		{a, "agent", "forgeyard_transport_messages_total", []string{"family", "agent", "outcome", "ok"}},
		{a, "agent", "forgeyard_heartbeat_rtt_seconds", nil},
		{a, "agent", "forgeyard_log_bytes_total", []string{"side", "agent"}},
		{a, "agent", "forgeyard_log_frames_total", []string{"side", "agent"}},
		{a, "agent", "forgeyard_cas_bytes_total", []string{"direction", "upload"}},
		{a, "agent", "forgeyard_cas_objects_total", []string{"direction", "upload"}},
	}
	for _, c := range checks {
		if v := enginetest.FamilyValue(c.fams, c.name, c.labels...); v <= 0 {
			t.Errorf("%s %s%v = %v, want > 0", c.side, c.name, c.labels, v)
		}
	}
	for _, fams := range []map[string]*dto.MetricFamily{d, a} {
		for _, g := range []string{"forgeyard_transport_control_queue_bytes", "forgeyard_transport_log_queue_bytes",
			"forgeyard_transport_cas_queue_bytes", "forgeyard_log_spool_bytes"} {
			if v := enginetest.FamilyValue(fams, g); v < 0 {
				t.Errorf("%s = %v (missing or negative)", g, v)
			}
		}
	}
	// No identifier leaks into a label value (§208).
	for _, text := range []string{dtext, atext} {
		for _, id := range []string{r.done.Runner.String(), r.done.Attempt.String(), r.doneLease.String()} {
			if strings.Contains(text, id) {
				t.Errorf("/metrics contains identifier %s", id)
			}
		}
	}
	metricstest.PromtoolCheck(t, dtext)
	metricstest.PromtoolCheck(t, atext)
}

// TestTraceSpansDaemonAndAgent: with FeatureTraceContextV1 negotiated,
// lease.dispatch (daemon) → lease.ack (agent) → lease.ack handling
// (daemon), and attempt.complete (agent) → attempt.complete (daemon) are
// ONE trace, each span the child of the previous hop, across both
// services.
func TestTraceSpansDaemonAndAgent(t *testing.T) {
	r := runTelemetry(t)
	lease := r.doneLease.String()
	find := func(spans tracetest.SpanStubs, name telemetry.SpanName, service string) *tracetest.SpanStub {
		for i := range spans {
			s := &spans[i]
			if s.Name != string(name) {
				continue
			}
			svc := ""
			for _, kv := range s.Resource.Attributes() {
				if kv.Key == "service.name" {
					svc = kv.Value.AsString()
				}
			}
			for _, kv := range s.Attributes {
				if kv.Key == "forgeyard.lease" && kv.Value.AsString() == lease && svc == service {
					return s
				}
			}
		}
		return nil
	}
	var dispatch, agentAck, daemonAck, agentDone, daemonDone *tracetest.SpanStub
	named := func(spans tracetest.SpanStubs, name telemetry.SpanName) bool {
		for _, s := range spans {
			if s.Name == string(name) {
				return true
			}
		}
		return false
	}
	var casStream, logStream bool
	// The daemon's spans end after the hooks the run waited for: poll the
	// exporter (synchronous) until all five are there.
	deadline := time.Now().Add(5 * time.Second)
	for {
		spans := r.exp.GetSpans()
		dispatch = find(spans, telemetry.SpanDispatch, "forgeyard-daemon")
		agentAck = find(spans, telemetry.SpanLeaseAck, "forgeyard-agent")
		daemonAck = find(spans, telemetry.SpanLeaseAck, "forgeyard-daemon")
		agentDone = find(spans, telemetry.SpanComplete, "forgeyard-agent")
		daemonDone = find(spans, telemetry.SpanComplete, "forgeyard-daemon")
		casStream, logStream = named(spans, telemetry.SpanCasStream), named(spans, telemetry.SpanLogStream)
		if dispatch != nil && agentAck != nil && daemonAck != nil && agentDone != nil && daemonDone != nil && casStream && logStream {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("spans missing: dispatch %v, agent ack %v, daemon ack %v, agent complete %v, daemon complete %v, cas.stream %v, log.stream %v (have %d spans)",
				dispatch != nil, agentAck != nil, daemonAck != nil, agentDone != nil, daemonDone != nil, casStream, logStream, len(spans))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The session's own spans (ended before the first lease).
	spans := r.exp.GetSpans()
	for _, want := range []struct {
		name    telemetry.SpanName
		service string
	}{
		{telemetry.SpanConnect, "forgeyard-agent"},
		{telemetry.SpanHandshake, "forgeyard-agent"}, {telemetry.SpanHandshake, "forgeyard-daemon"},
		{telemetry.SpanNegotiate, "forgeyard-daemon"},
		{telemetry.SpanRegister, "forgeyard-agent"}, {telemetry.SpanRegister, "forgeyard-daemon"},
		{telemetry.SpanResync, "forgeyard-agent"}, {telemetry.SpanResync, "forgeyard-daemon"},
		{telemetry.SpanCancel, "forgeyard-daemon"},
	} {
		found := false
		for _, s := range spans {
			for _, kv := range s.Resource.Attributes() {
				if s.Name == string(want.name) && kv.Key == "service.name" && kv.Value.AsString() == want.service {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("no %s span from %s", want.name, want.service)
		}
	}
	trace := dispatch.SpanContext.TraceID()
	for _, hop := range []struct {
		name         string
		span, parent *tracetest.SpanStub
		remoteParent bool
	}{
		{"agent lease.ack", agentAck, dispatch, true},
		{"daemon lease.ack", daemonAck, agentAck, true},
		{"agent attempt.complete", agentDone, agentAck, false},
		{"daemon attempt.complete", daemonDone, agentDone, true},
	} {
		if got := hop.span.SpanContext.TraceID(); got != trace {
			t.Errorf("%s: trace %s, want %s", hop.name, got, trace)
		}
		if got, want := hop.span.Parent.SpanID(), hop.parent.SpanContext.SpanID(); got != want {
			t.Errorf("%s: parent span %s, want %s", hop.name, got, want)
		}
		if hop.span.Parent.IsRemote() != hop.remoteParent {
			t.Errorf("%s: remote parent %v, want %v", hop.name, hop.span.Parent.IsRemote(), hop.remoteParent)
		}
	}
}
