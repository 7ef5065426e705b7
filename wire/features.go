package wire

import (
	"log/slog"
	"strings"

	"forgeyard.dev/transport/wire/internal/enum"
	"forgeyard.dev/transport/wire/postcard"
)

// ProtocolFeature is an optional protocol capability advertised during
// negotiation (§245–247). Wire values are explicit u16s and never reused.
// A peer ignores feature numbers it does not know.
type ProtocolFeature uint16

// Known features.
const (
	FeatureLogResumeV1      ProtocolFeature = 1
	FeatureCasRangeResumeV1 ProtocolFeature = 2
	FeatureDeviceControlV1  ProtocolFeature = 3
	FeatureLogCompressionV1 ProtocolFeature = 4
	FeatureSigningV1        ProtocolFeature = 5
	FeatureTraceContextV1   ProtocolFeature = 6
	// FeatureRetryAfterV1: the agent obeys structured retry hints — the
	// daemon may answer its hello or registration with
	// agent.RegistrationDeferredV1{retry_after_ms} instead of
	// RegistrationRejectedV1{Overloaded} (since 1.2).
	FeatureRetryAfterV1 ProtocolFeature = 7
	// FeatureRestartTokenV1: the daemon gives the agent a restart token
	// (agent.RestartTokenV1), and the agent ends its link at once when a
	// restart hint carrying that token arrives from the daemon's address
	// (docs/protocols/internal/restart-hint.md; since 1.3).
	FeatureRestartTokenV1 ProtocolFeature = 8

	maxKnownFeature = 63
)

var featureNames = [...]string{
	FeatureLogResumeV1:      "LogResumeV1",
	FeatureCasRangeResumeV1: "CasRangeResumeV1",
	FeatureDeviceControlV1:  "DeviceControlV1",
	FeatureLogCompressionV1: "LogCompressionV1",
	FeatureSigningV1:        "SigningV1",
	FeatureTraceContextV1:   "TraceContextV1",
	FeatureRetryAfterV1:     "RetryAfterV1",
	FeatureRestartTokenV1:   "RestartTokenV1",
}

// String returns the feature's name, or Feature(n) for a number this build does not know.
func (f ProtocolFeature) String() string { return enum.Name(featureNames[:], f, "Feature") }

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (f ProtocolFeature) LogValue() slog.Value { return slog.StringValue(f.String()) }

// FeatureSet is a set of features numbered 0..63. Unknown numbers above 63
// are dropped on decode (they cannot be features this build knows).
type FeatureSet uint64

// MaxFeatures bounds the number of feature entries accepted on decode.
const MaxFeatures = 64

// Features returns a set holding fs.
func Features(fs ...ProtocolFeature) FeatureSet {
	var s FeatureSet
	for _, f := range fs {
		s = s.With(f)
	}
	return s
}

// Has reports whether f is in s.
func (s FeatureSet) Has(f ProtocolFeature) bool {
	return f <= maxKnownFeature && s&(1<<f) != 0
}

// With returns s plus f.
func (s FeatureSet) With(f ProtocolFeature) FeatureSet {
	if f > maxKnownFeature {
		return s
	}
	return s | 1<<f
}

// Intersect returns the features both sides support (§247).
func (s FeatureSet) Intersect(o FeatureSet) FeatureSet { return s & o }

// List returns the features in ascending order.
func (s FeatureSet) List() []ProtocolFeature {
	var out []ProtocolFeature
	for f := ProtocolFeature(0); f <= maxKnownFeature; f++ {
		if s.Has(f) {
			out = append(out, f)
		}
	}
	return out
}

// String lists the features by name in ascending order, as {A,B}.
func (s FeatureSet) String() string {
	var parts []string
	for _, f := range s.List() {
		parts = append(parts, f.String())
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (s FeatureSet) LogValue() slog.Value { return slog.StringValue(s.String()) }

// AppendPostcard appends s as seq<u16> in ascending order.
func (s FeatureSet) AppendPostcard(b []byte) []byte {
	n := 0
	for x := s; x != 0; x &= x - 1 {
		n++
	}
	b = postcard.AppendLen(b, n)
	for f := ProtocolFeature(0); f <= maxKnownFeature; f++ {
		if s.Has(f) {
			b = postcard.AppendU16(b, uint16(f))
		}
	}
	return b
}

// DecodePostcard reads s; unknown feature numbers are ignored.
func (s *FeatureSet) DecodePostcard(d *postcard.Decoder) {
	// Element by element, as Rust decodes: a bad element reports its own
	// error and only running out of input reports UnexpectedEnd. Nothing is
	// allocated, and the loop ends at the first failure.
	n := d.Len(MaxFeatures)
	*s = 0
	for i := 0; i < n && !d.Failed(); i++ {
		*s = s.With(ProtocolFeature(d.U16()))
	}
}

// Implemented is the set of features this build implements: a daemon
// offers it and an agent advertises it unless configured otherwise, and
// both then use only the negotiated intersection (§247). Each release
// records it in the compatibility manifest (matrix/manifest.json).
//
// Protocol 1.1 added LogCompressionV1: an agent sends Flate-compressed log
// streams only to a daemon that negotiated it (Raw otherwise); a daemon
// accepts both encodings from every agent, as 1.0 agents compress
// unconditionally.
//
// TraceContextV1 (since v0.3.0, protocol 1.2): the envelope's trace context is sent only
// to a peer that negotiated it (§211).
//
// RetryAfterV1 (since v0.3.0, protocol 1.2): an agent advertising it obeys
// agent.RegistrationDeferredV1; a daemon sends that message only to such
// agents (others get RegistrationRejectedV1{Overloaded, RetryBackoff}).
//
// RestartTokenV1 (protocol 1.3): a daemon sends agent.RestartTokenV1 only
// to agents that negotiated it; an agent without a token answers restart
// hints with a heartbeat probe as before.
var Implemented = Features(FeatureLogResumeV1, FeatureCasRangeResumeV1, FeatureLogCompressionV1, FeatureTraceContextV1,
	FeatureRetryAfterV1, FeatureRestartTokenV1)
