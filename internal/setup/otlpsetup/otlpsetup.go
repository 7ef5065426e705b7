// Package otlpsetup builds a command's tracing from its [telemetry]
// section and the standard OpenTelemetry environment variables: the OTLP
// exporter (HTTP/protobuf or gRPC), the resource (service.name,
// service.version, OTEL_RESOURCE_ATTRIBUTES) and the sampler
// (OTEL_TRACES_SAMPLER). The daemon and the agent use it; the relay has no
// tracing and does not link the exporter.
//
// Precedence: an explicit configuration wins over the environment. A
// telemetry.otlp_endpoint (or --otlp-endpoint) is used even when
// OTEL_EXPORTER_OTLP_ENDPOINT is set, and telemetry.otlp_protocol beats
// OTEL_EXPORTER_OTLP_PROTOCOL; with the key empty the environment decides
// (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT before OTEL_EXPORTER_OTLP_ENDPOINT,
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL before OTEL_EXPORTER_OTLP_PROTOCOL).
// Keys the configuration does not have come from the environment only:
// OTEL_SERVICE_NAME (default: the command's name), OTEL_RESOURCE_ATTRIBUTES,
// OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, OTEL_SDK_DISABLED, and
// what the exporters read themselves (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT,
// _COMPRESSION, _CERTIFICATE, ...). Metrics are served to Prometheus
// (/metrics), not pushed: the _METRICS_ variants of these variables are not
// read.
package otlpsetup

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics/telemetry"
)

// Protocols of OTEL_EXPORTER_OTLP_PROTOCOL and telemetry.otlp_protocol.
const (
	ProtocolHTTP = config.OTLPProtocolHTTP // "http/protobuf", the default
	ProtocolGRPC = config.OTLPProtocolGRPC // "grpc"
)

// Export says where and how spans are exported ("" Endpoint: off).
type Export struct {
	// Endpoint is the URL the exporter is given: for HTTP the full
	// .../v1/traces URL, for gRPC the collector's URL.
	Endpoint string
	// Protocol is ProtocolHTTP or ProtocolGRPC.
	Protocol string
	// Source names where Endpoint came from: "telemetry.otlp_endpoint",
	// "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" or "OTEL_EXPORTER_OTLP_ENDPOINT".
	Source string
	// Resource is what the spans carry: service.name, service.version and
	// OTEL_RESOURCE_ATTRIBUTES.
	Resource []attribute.KeyValue
	// Sampler describes the sampler ("parentbased_always_on", ...).
	Sampler string
}

// Tracing returns the tracing of a command named service
// ("forgeyard-daemon", "forgeyard-agent") from t and the process
// environment (see the package comment for precedence); with no endpoint
// tracing is off (spans are non-recording, the peer's trace context still
// propagates). The caller calls Flush at exit.
func Tracing(ctx context.Context, t config.Telemetry, service string) (*telemetry.Tracing, error) {
	tr, _, err := TracingEnv(ctx, t, service, os.Getenv)
	return tr, err
}

// TracingEnv is Tracing with the environment read through getenv; it also
// returns what it resolved, for the command's startup log.
func TracingEnv(ctx context.Context, t config.Telemetry, service string, getenv func(string) string) (*telemetry.Tracing, Export, error) {
	ex, err := Resolve(t, service, getenv)
	if err != nil || ex.Endpoint == "" {
		return telemetry.NewTracing(telemetry.TracingConfig{ServiceName: service}), ex, err
	}
	sampler, _, err := samplerFromEnv(getenv)
	if err != nil {
		return nil, ex, err
	}
	var exp sdktrace.SpanExporter
	switch ex.Protocol {
	case ProtocolGRPC:
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(ex.Endpoint))
	default:
		exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(ex.Endpoint))
	}
	if err != nil {
		return nil, ex, fmt.Errorf("%s: %w", ex.Source, err)
	}
	return telemetry.NewTracing(telemetry.TracingConfig{
		ServiceName: service, Exporter: exp, Sampler: sampler,
		Resource: resource.NewSchemaless(ex.Resource...),
	}), ex, nil
}

// Resolve works out the export of a command named service from t and the
// environment, without building anything.
func Resolve(t config.Telemetry, service string, getenv func(string) string) (Export, error) {
	var ex Export
	if v := strings.TrimSpace(getenv("OTEL_SDK_DISABLED")); strings.EqualFold(v, "true") {
		return ex, nil
	}
	ex.Protocol, ex.Source = t.OTLPProtocol, "telemetry.otlp_protocol"
	if ex.Protocol == "" {
		for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
			if v := strings.TrimSpace(getenv(k)); v != "" {
				ex.Protocol, ex.Source = v, k
				break
			}
		}
	}
	switch ex.Protocol {
	case "":
		ex.Protocol = ProtocolHTTP
	case ProtocolHTTP, ProtocolGRPC:
	default:
		return Export{}, fmt.Errorf("%s: protocol %q is not supported (want %q or %q)", ex.Source, ex.Protocol, ProtocolHTTP, ProtocolGRPC)
	}

	// The endpoint: the key, then the signal-specific variable (a full
	// URL, used as given), then the general one (a base URL; HTTP appends
	// /v1/traces).
	base, full := "", ""
	switch {
	case t.OTLPEndpoint != "":
		base, ex.Source = t.OTLPEndpoint, "telemetry.otlp_endpoint"
	case strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) != "":
		full, ex.Source = strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")), "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	case strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_ENDPOINT")) != "":
		base, ex.Source = strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_ENDPOINT")), "OTEL_EXPORTER_OTLP_ENDPOINT"
	default:
		return Export{Protocol: ex.Protocol}, nil
	}
	raw := base + full
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Export{}, fmt.Errorf("%s: %q is not an http:// or https:// URL with a host (e.g. \"http://127.0.0.1:4318\")", ex.Source, redact(raw))
	}
	if u.User != nil {
		return Export{}, fmt.Errorf("%s: the URL carries user credentials; use OTEL_EXPORTER_OTLP_HEADERS", ex.Source)
	}
	if base != "" && ex.Protocol == ProtocolHTTP {
		u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
	}
	ex.Endpoint = u.String()

	_, desc, err := samplerFromEnv(getenv)
	if err != nil {
		return Export{}, err
	}
	ex.Sampler = desc
	ex.Resource, err = resourceAttrs(service, getenv)
	if err != nil {
		return Export{}, err
	}
	return ex, nil
}

func redact(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		u.User = url.User("REDACTED")
		return u.String()
	}
	return s
}

// resourceAttrs: OTEL_RESOURCE_ATTRIBUTES (key=value,... percent-encoded
// values), then service.name from OTEL_SERVICE_NAME, else from the
// attributes, else service; service.version from the build unless the
// attributes set it.
func resourceAttrs(service string, getenv func(string) string) ([]attribute.KeyValue, error) {
	attrs := map[string]string{}
	var order []string
	if v := strings.TrimSpace(getenv("OTEL_RESOURCE_ATTRIBUTES")); v != "" {
		for _, pair := range strings.Split(v, ",") {
			pair = strings.TrimSpace(pair)
			if pair == "" {
				continue
			}
			k, val, ok := strings.Cut(pair, "=")
			k = strings.TrimSpace(k)
			if !ok || k == "" {
				return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %q is not key=value", pair)
			}
			dec, err := url.PathUnescape(strings.TrimSpace(val))
			if err != nil {
				return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: value of %q: %v", k, err)
			}
			if _, seen := attrs[k]; !seen {
				order = append(order, k)
			}
			attrs[k] = dec
		}
	}
	if n := strings.TrimSpace(getenv("OTEL_SERVICE_NAME")); n != "" {
		attrs["service.name"] = n
	} else if _, ok := attrs["service.name"]; !ok {
		attrs["service.name"] = service
	}
	if _, ok := attrs["service.version"]; !ok {
		attrs["service.version"] = ServiceVersion()
	}
	out := []attribute.KeyValue{attribute.String("service.name", attrs["service.name"]), attribute.String("service.version", attrs["service.version"])}
	for _, k := range order {
		if k != "service.name" && k != "service.version" {
			out = append(out, attribute.String(k, attrs[k]))
		}
	}
	return out, nil
}

// samplerFromEnv reads OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG
// (default parentbased_always_on: a trace the peer sampled is sampled here
// too).
func samplerFromEnv(getenv func(string) string) (sdktrace.Sampler, string, error) {
	name := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER")))
	if name == "" {
		name = "parentbased_always_on"
	}
	ratio := 1.0
	arg := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER_ARG"))
	if strings.HasSuffix(name, "traceidratio") && arg != "" {
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return nil, "", fmt.Errorf("OTEL_TRACES_SAMPLER_ARG: %q is not a ratio 0–1 for %s", arg, name)
		}
		ratio = r
	}
	desc := name
	if strings.HasSuffix(name, "traceidratio") {
		desc += "(" + strconv.FormatFloat(ratio, 'g', -1, 64) + ")"
	}
	switch name {
	case "always_on":
		return sdktrace.AlwaysSample(), desc, nil
	case "always_off":
		return sdktrace.NeverSample(), desc, nil
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(ratio), desc, nil
	case "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), desc, nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), desc, nil
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)), desc, nil
	}
	return nil, "", fmt.Errorf("OTEL_TRACES_SAMPLER: %q is not supported (always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio)", name)
}

// ServiceVersion is the service.version resource attribute: the main
// module's version from the build information ("devel" for a build
// outside a released module), with the VCS revision when the build
// recorded it.
func ServiceVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	v := bi.Main.Version
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 && !strings.Contains(v, s.Value[:12]) {
			v += "+" + s.Value[:12]
		}
	}
	return v
}

// FlushTimeout bounds Flush: the collector may be gone at exit.
const FlushTimeout = 5 * time.Second

// Flush shuts t down, exporting the last spans, waiting at most
// FlushTimeout. Commands defer it right after Tracing.
func Flush(t *telemetry.Tracing) {
	ctx, cancel := context.WithTimeout(context.Background(), FlushTimeout)
	defer cancel()
	_ = t.Shutdown(ctx)
}
