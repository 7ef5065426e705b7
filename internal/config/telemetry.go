package config

import (
	"net/url"
	"strings"
)

// OTLP protocols (telemetry.otlp_protocol, OTEL_EXPORTER_OTLP_PROTOCOL).
const (
	OTLPProtocolHTTP = "http/protobuf"
	OTLPProtocolGRPC = "grpc"
)

// Telemetry configures trace export, shared by the daemon and the agent.
// OTLP export is off by default. The standard OTEL_* environment variables
// apply too; an explicit key wins over its variable (internal/setup/otlpsetup).
//
//	[telemetry]
//	otlp_endpoint = "http://127.0.0.1:4318"
//	otlp_protocol = "http/protobuf"   # or "grpc" (then e.g. "http://127.0.0.1:4317")
type Telemetry struct {
	// OTLPEndpoint is the base URL of an OTLP trace receiver (an
	// OpenTelemetry collector): "http://host:4318" or "https://host:4318";
	// over HTTP spans are POSTed to <endpoint>/v1/traces as protobuf. ""
	// leaves it to OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
	// OTEL_EXPORTER_OTLP_ENDPOINT; none of them turns trace export off (the
	// trace context still propagates to the peer).
	OTLPEndpoint string `toml:"otlp_endpoint"`
	// OTLPProtocol is OTLPProtocolHTTP or OTLPProtocolGRPC ("":
	// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL, else
	// http/protobuf). With grpc the endpoint is the collector's gRPC URL
	// (http:// for plaintext, https:// for TLS) and nothing is appended.
	OTLPProtocol string `toml:"otlp_protocol"`
}

// Validate checks the keys (prefix "telemetry.").
func (t Telemetry) Validate() error {
	switch t.OTLPProtocol {
	case "", OTLPProtocolHTTP, OTLPProtocolGRPC:
	default:
		return invalid("telemetry.otlp_protocol", "%q is not supported (want %q or %q)", t.OTLPProtocol, OTLPProtocolHTTP, OTLPProtocolGRPC)
	}
	if t.OTLPEndpoint == "" {
		return nil
	}
	u, err := url.Parse(t.OTLPEndpoint)
	if err == nil && u.User != nil {
		// Never echo it: it holds credentials.
		return invalid("telemetry.otlp_endpoint", "the URL carries user credentials; they are not supported (and must not sit in a config key)")
	}
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return invalid("telemetry.otlp_endpoint", "%q is not an http:// or https:// URL with a host (e.g. \"http://127.0.0.1:4318\")", t.OTLPEndpoint)
	}
	if u.RawQuery != "" || u.Fragment != "" || strings.Contains(u.Path, "/v1/traces") {
		return invalid("telemetry.otlp_endpoint", "%q: give the collector's base URL (the exporter appends /v1/traces), without query or fragment", t.OTLPEndpoint)
	}
	return nil
}
