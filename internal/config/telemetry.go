package config

import (
	"net/url"
	"strings"
)

// Telemetry configures trace export, shared by the daemon and the agent.
// OTLP export is off by default.
//
//	[telemetry]
//	otlp_endpoint = "http://127.0.0.1:4318"
type Telemetry struct {
	// OTLPEndpoint is the base URL of an OTLP/HTTP trace receiver (an
	// OpenTelemetry collector): "http://host:4318" or "https://host:4318";
	// spans are POSTed to <endpoint>/v1/traces as protobuf. "" turns trace
	// export off (the trace context still propagates to the peer).
	OTLPEndpoint string `toml:"otlp_endpoint"`
}

// Validate checks the keys (prefix "telemetry.").
func (t Telemetry) Validate() error {
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
