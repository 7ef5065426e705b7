package otlpsetup_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/otlpsetup"
	"forgeyard.dev/transport/semantics/telemetry"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// httpReceiver is an in-process OTLP/HTTP trace receiver: every export
// request POSTed to /v1/traces (or path) is decoded and sent on the channel.
func httpReceiver(t *testing.T, path string) (*httptest.Server, <-chan *coltracepb.ExportTraceServiceRequest) {
	t.Helper()
	got := make(chan *coltracepb.ExportTraceServiceRequest, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != path || r.Method != http.MethodPost {
			t.Errorf("receiver: %s %s, want POST %s", r.Method, r.URL.Path, path)
			http.NotFound(w, r)
			return
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/x-protobuf" {
			t.Errorf("receiver: content type %q", ct)
		}
		if h := r.Header.Get("X-Test-Header"); h != "" && h != "from-env" {
			t.Errorf("receiver: X-Test-Header %q", h)
		}
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Error(err)
			return
		}
		req := &coltracepb.ExportTraceServiceRequest{}
		if err := proto.Unmarshal(b, req); err != nil {
			t.Errorf("receiver: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		got <- req
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return srv, got
}

type grpcTraces struct {
	coltracepb.UnimplementedTraceServiceServer
	got chan *coltracepb.ExportTraceServiceRequest
}

func (g *grpcTraces) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	g.got <- req
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// grpcReceiver is an in-process OTLP/gRPC trace receiver on loopback.
func grpcReceiver(t *testing.T) (string, <-chan *coltracepb.ExportTraceServiceRequest) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	g := &grpcTraces{got: make(chan *coltracepb.ExportTraceServiceRequest, 16)}
	coltracepb.RegisterTraceServiceServer(srv, g)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return "http://" + ln.Addr().String(), g.got
}

// oneSpan starts and ends one span and flushes the exporter.
func oneSpan(t *testing.T, tr *telemetry.Tracing) {
	t.Helper()
	_, span := tr.Start(context.Background(), telemetry.SpanConnect)
	if !span.SpanContext().IsSampled() {
		t.Fatal("the root span was not sampled with the default sampler")
	}
	span.End()
	otlpsetup.Flush(tr)
}

func receive(t *testing.T, got <-chan *coltracepb.ExportTraceServiceRequest) *coltracepb.ExportTraceServiceRequest {
	t.Helper()
	select {
	case req := <-got:
		return req
	case <-time.After(15 * time.Second):
		t.Fatal("the receiver got no export request")
		return nil
	}
}

// resourceOf returns the resource attributes and span names of a request.
func resourceOf(t *testing.T, req *coltracepb.ExportTraceServiceRequest) (map[string]string, []string) {
	t.Helper()
	if len(req.ResourceSpans) != 1 {
		t.Fatalf("%d resource spans", len(req.ResourceSpans))
	}
	rs := req.ResourceSpans[0]
	attrs := map[string]string{}
	for _, kv := range rs.GetResource().GetAttributes() {
		attrs[kv.Key] = kv.GetValue().GetStringValue()
	}
	var names []string
	for _, ss := range rs.ScopeSpans {
		for _, s := range ss.Spans {
			names = append(names, s.Name)
		}
	}
	return attrs, names
}

// TestEnvEndpointHTTP: with no telemetry.otlp_endpoint, the standard
// environment variables select an OTLP/HTTP receiver, name the service and
// add resource attributes; the exporter sends OTEL_EXPORTER_OTLP_HEADERS.
func TestEnvEndpointHTTP(t *testing.T) {
	srv, got := httpReceiver(t, "/v1/traces")
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "X-Test-Header=from-env") // read by the exporter itself
	tr, ex, err := otlpsetup.TracingEnv(context.Background(), config.Telemetry{}, "forgeyard-daemon", env(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL,
		"OTEL_SERVICE_NAME":           "daemon-eu-1",
		"OTEL_RESOURCE_ATTRIBUTES":    "deployment.environment=staging,team=ci%20infra,service.name=ignored",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if ex.Source != "OTEL_EXPORTER_OTLP_ENDPOINT" || ex.Protocol != otlpsetup.ProtocolHTTP || ex.Endpoint != srv.URL+"/v1/traces" {
		t.Errorf("resolved %+v", ex)
	}
	oneSpan(t, tr)
	attrs, names := resourceOf(t, receive(t, got))
	if attrs["service.name"] != "daemon-eu-1" {
		t.Errorf("service.name = %q, want OTEL_SERVICE_NAME's (it beats the attribute)", attrs["service.name"])
	}
	if attrs["service.version"] == "" || attrs["service.version"] != otlpsetup.ServiceVersion() {
		t.Errorf("service.version = %q, want %q", attrs["service.version"], otlpsetup.ServiceVersion())
	}
	if attrs["deployment.environment"] != "staging" || attrs["team"] != "ci infra" {
		t.Errorf("resource attributes = %v", attrs)
	}
	if len(names) != 1 || names[0] != string(telemetry.SpanConnect) {
		t.Errorf("spans = %v", names)
	}
}

// TestEnvTracesEndpointIsFullURL: the signal-specific variable is used as
// given (no /v1/traces appended) and beats the general one.
func TestEnvTracesEndpointIsFullURL(t *testing.T) {
	srv, got := httpReceiver(t, "/custom/traces")
	tr, ex, err := otlpsetup.TracingEnv(context.Background(), config.Telemetry{}, "forgeyard-agent", env(map[string]string{
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": srv.URL + "/custom/traces",
		"OTEL_EXPORTER_OTLP_ENDPOINT":        "http://127.0.0.1:1",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if ex.Source != "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" {
		t.Errorf("source = %q", ex.Source)
	}
	oneSpan(t, tr)
	attrs, _ := resourceOf(t, receive(t, got))
	if attrs["service.name"] != "forgeyard-agent" {
		t.Errorf("service.name = %q, want the command's name", attrs["service.name"])
	}
}

// TestConfigWinsOverEnv: telemetry.otlp_endpoint and otlp_protocol beat
// the environment (the documented precedence).
func TestConfigWinsOverEnv(t *testing.T) {
	srv, got := httpReceiver(t, "/v1/traces")
	tr, ex, err := otlpsetup.TracingEnv(context.Background(), config.Telemetry{OTLPEndpoint: srv.URL, OTLPProtocol: config.OTLPProtocolHTTP}, "forgeyard-daemon", env(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
		"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if ex.Source != "telemetry.otlp_endpoint" || ex.Protocol != otlpsetup.ProtocolHTTP {
		t.Errorf("resolved %+v", ex)
	}
	oneSpan(t, tr)
	receive(t, got)
}

// TestGRPC: OTEL_EXPORTER_OTLP_PROTOCOL=grpc exports to a gRPC receiver;
// telemetry.otlp_protocol = "grpc" does too.
func TestGRPC(t *testing.T) {
	addr, got := grpcReceiver(t)
	tr, ex, err := otlpsetup.TracingEnv(context.Background(), config.Telemetry{}, "forgeyard-agent", env(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": addr,
		"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
		"OTEL_RESOURCE_ATTRIBUTES":    "host.name=builder-7",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if ex.Protocol != otlpsetup.ProtocolGRPC || ex.Endpoint != addr {
		t.Errorf("resolved %+v", ex)
	}
	oneSpan(t, tr)
	attrs, names := resourceOf(t, receive(t, got))
	if attrs["service.name"] != "forgeyard-agent" || attrs["host.name"] != "builder-7" || attrs["service.version"] == "" {
		t.Errorf("resource = %v", attrs)
	}
	if len(names) != 1 {
		t.Errorf("spans = %v", names)
	}

	tr, _, err = otlpsetup.TracingEnv(context.Background(), config.Telemetry{OTLPEndpoint: addr, OTLPProtocol: config.OTLPProtocolGRPC}, "forgeyard-daemon", env(nil))
	if err != nil {
		t.Fatal(err)
	}
	oneSpan(t, tr)
	if attrs, _ := resourceOf(t, receive(t, got)); attrs["service.name"] != "forgeyard-daemon" {
		t.Errorf("service.name = %q", attrs["service.name"])
	}
}

// TestSampler: OTEL_TRACES_SAMPLER and _ARG choose the sampler.
func TestSampler(t *testing.T) {
	cases := []struct {
		sampler, arg string
		sampled      bool
		desc         string
	}{
		{"", "", true, "parentbased_always_on"},
		{"always_off", "", false, "always_off"},
		{"traceidratio", "0", false, "traceidratio(0)"},
		{"parentbased_traceidratio", "1", true, "parentbased_traceidratio(1)"},
		{"always_on", "", true, "always_on"},
	}
	srv, _ := httpReceiver(t, "/v1/traces")
	for _, c := range cases {
		tr, ex, err := otlpsetup.TracingEnv(context.Background(), config.Telemetry{OTLPEndpoint: srv.URL}, "forgeyard-daemon",
			env(map[string]string{"OTEL_TRACES_SAMPLER": c.sampler, "OTEL_TRACES_SAMPLER_ARG": c.arg}))
		if err != nil {
			t.Fatalf("%s: %v", c.sampler, err)
		}
		_, span := tr.Start(context.Background(), telemetry.SpanConnect)
		if span.SpanContext().IsSampled() != c.sampled || ex.Sampler != c.desc {
			t.Errorf("%s %s: sampled=%v (%q), want %v (%q)", c.sampler, c.arg, span.SpanContext().IsSampled(), ex.Sampler, c.sampled, c.desc)
		}
		span.End()
		otlpsetup.Flush(tr)
	}
}

// TestOffAndErrors: no endpoint anywhere (or OTEL_SDK_DISABLED) is off;
// bad values are errors naming the variable.
func TestOffAndErrors(t *testing.T) {
	tr, ex, err := otlpsetup.TracingEnv(context.Background(), config.Telemetry{}, "forgeyard-daemon", env(nil))
	if err != nil || ex.Endpoint != "" {
		t.Fatalf("no endpoint: %+v %v", ex, err)
	}
	if _, span := tr.Start(context.Background(), telemetry.SpanConnect); span.IsRecording() {
		t.Error("tracing without an endpoint records spans")
	}
	if ex, err := otlpsetup.Resolve(config.Telemetry{OTLPEndpoint: "http://c:4318"}, "x", env(map[string]string{"OTEL_SDK_DISABLED": "true"})); err != nil || ex.Endpoint != "" {
		t.Errorf("OTEL_SDK_DISABLED: %+v %v", ex, err)
	}
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://u:secret@c:4318"}, "credentials"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "OTEL_TRACES_SAMPLER_ARG"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_RESOURCE_ATTRIBUTES": "novalue"}, "OTEL_RESOURCE_ATTRIBUTES"},
	} {
		_, err := otlpsetup.Resolve(config.Telemetry{}, "x", env(c.env))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one naming %s", c.env, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("error echoes a password: %v", err)
		}
	}
}
