package agent

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"forgeyard.dev/transport/wire"
)

var requiredTypes = map[reflect.Type]bool{
	reflect.TypeOf(wire.RunnerId{}):           true,
	reflect.TypeOf(wire.AgentSessionId{}):     true,
	reflect.TypeOf(wire.TransportSessionId{}): true,
	reflect.TypeOf(wire.MessageId{}):          true,
	reflect.TypeOf(wire.LeaseId{}):            true,
	reflect.TypeOf(wire.JobId{}):              true,
	reflect.TypeOf(wire.JobAttemptId{}):       true,
	reflect.TypeOf(wire.JobSpecId{}):          true,
	reflect.TypeOf(wire.CapabilityDigest{}):   true,
	reflect.TypeOf(wire.Digest{}):             true, // CasObjectRef.Digest
}

// idFields returns every non-zero identifier or digest reachable from v, in
// a fixed order, with its path.
func idFields(v reflect.Value, path string, out *[]reflect.Value, paths *[]string) {
	if requiredTypes[v.Type()] {
		if !v.IsZero() {
			*out = append(*out, v)
			*paths = append(*paths, path)
		}
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			idFields(v.Field(i), path+"."+v.Type().Field(i).Name, out, paths)
		}
	case reflect.Slice:
		for i := 0; i < v.Len(); i++ {
			idFields(v.Index(i), path+"[]", out, paths)
		}
	}
}

// Zeroing any identifier or digest of any sample makes Validate fail with a
// *ValidationError.
func TestValidateRejectsZeroIdentifiers(t *testing.T) {
	n := len(Samples())
	checked := 0
	for i := 0; i < n; i++ {
		var fields []reflect.Value
		var paths []string
		idFields(reflect.ValueOf(Samples()[i]).Elem(), "", &fields, &paths)
		for j := range fields {
			m := Samples()[i]
			fields, paths = fields[:0], paths[:0]
			idFields(reflect.ValueOf(m).Elem(), "", &fields, &paths)
			if _, hb := m.(*HeartbeatV1); hb && paths[j] == ".CapabilityDigest" {
				continue // an idle agent may not have computed one yet (shared vector heartbeat/idle)
			}
			fields[j].Set(reflect.Zero(fields[j].Type()))
			err := m.Validate()
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Errorf("%s with zero %s: Validate = %v, want a *ValidationError", nameOf(m), paths[j], err)
			}
			checked++
		}
	}
	if checked < 100 {
		t.Errorf("only %d identifier fields checked; the walk is broken", checked)
	}
}

// Each case breaks one rule; Validate must name the field.
func TestValidateRejects(t *testing.T) {
	cases := []struct {
		field  string
		mutate func() wire.Message
	}{
		{"role", func() wire.Message { m := first[*TransportHelloV1](t); m.Role = 9; return m }},
		{"versions", func() wire.Message {
			m := first[*TransportHelloV1](t)
			m.Versions = wire.ProtocolRange{Min: wire.V(1, 2), Max: wire.V(1, 1)}
			return m
		}},
		{"versions", func() wire.Message { m := first[*TransportHelloV1](t); m.Versions = wire.ProtocolRange{}; return m }},
		{"agent_session", func() wire.Message { m := first[*TransportHelloV1](t); m.HasAgentSession = false; return m }},
		{"agent_version", func() wire.Message { m := first[*TransportHelloV1](t); m.AgentVersion = ""; return m }},
		{"agent_version", func() wire.Message { m := first[*TransportHelloV1](t); m.AgentVersion = "\xff"; return m }},
		{"negotiated", func() wire.Message { m := first[*HelloAckV1](t); m.Negotiated = wire.V(1, 1); return m }},
		{"server_range", func() wire.Message { m := first[*HelloAckV1](t); m.ServerRange.Min = wire.V(3, 0); return m }},
		{"server_time_ms", func() wire.Message { m := first[*HelloAckV1](t); m.ServerTimeMs = 0; return m }},
		{"challenge", func() wire.Message { m := first[*HelloAckV1](t); m.Challenge = [32]byte{}; return m }},
		{"agent_version", func() wire.Message { m := first[*RegisterAgentV1](t); m.AgentVersion = ""; return m }},
		{"capabilities.os", func() wire.Message { m := first[*RegisterAgentV1](t); m.Capabilities.OS = ""; return m }},
		{"capabilities.arch", func() wire.Message { m := first[*RegisterAgentV1](t); m.Capabilities.Arch = ""; return m }},
		{"capabilities.labels", func() wire.Message {
			m := first[*RegisterAgentV1](t)
			m.Capabilities.Labels = []string{"a", "b", "a"}
			return m
		}},
		{"capabilities.labels", func() wire.Message { m := first[*RegisterAgentV1](t); m.Capabilities.Labels = []string{""}; return m }},
		{"capabilities.tools", func() wire.Message {
			m := first[*RegisterAgentV1](t)
			m.Capabilities.Tools = []string{"ok", "bad\xc3"}
			return m
		}},
		{"capabilities.max_parallel", func() wire.Message { m := first[*RegisterAgentV1](t); m.Capabilities.MaxParallel = 0; return m }},
		{"key_proof", func() wire.Message { m := first[*RegisterAgentV1](t); m.KeyProof = nil; return m }},
		{"resume_epoch", func() wire.Message { m := first[*RegisterAgentV1](t); m.ResumeEpoch = 0; return m }},
		{"resume_epoch", func() wire.Message { m := first[*RegisterAgentV1](t); m.HasResumeEpoch = false; return m }},
		{"capabilities.max_parallel", func() wire.Message { m := first[*CapabilityUpdateV1](t); m.Full.MaxParallel = 0; return m }},
		{"epoch", func() wire.Message { m := first[*RegistrationAcceptedV1](t); m.Epoch = 0; return m }},
		{"heartbeat_interval_ms", func() wire.Message { m := first[*RegistrationAcceptedV1](t); m.HeartbeatIntervalMs = 0; return m }},
		{"lease_renew_interval_ms", func() wire.Message {
			m := first[*RegistrationAcceptedV1](t)
			m.LeaseRenewIntervalMs = 0
			return m
		}},
		{"max_backoff_ms", func() wire.Message { m := first[*RegistrationAcceptedV1](t); m.MaxBackoffMs = 0; return m }},
		{"server_time_ms", func() wire.Message { m := first[*RegistrationAcceptedV1](t); m.ServerTimeMs = 0; return m }},
		{"alternate_endpoints", func() wire.Message {
			m := first[*RegistrationAcceptedV1](t)
			m.AlternateEndpoints = append(m.AlternateEndpoints, "")
			return m
		}},
		{"code", func() wire.Message { m := first[*RegistrationRejectedV1](t); m.Code = 0; return m }},
		{"retry", func() wire.Message { m := first[*RegistrationRejectedV1](t); m.Retry = 5; return m }},
		{"message", func() wire.Message { m := first[*RegistrationRejectedV1](t); m.Message = "bad \xff"; return m }},
		{"server_range", func() wire.Message { m := first[*RegistrationRejectedV1](t); m.HasServerRange = false; return m }},
		{"server_range", func() wire.Message {
			m := first[*RegistrationRejectedV1](t)
			m.ServerRange.Max = wire.V(1, 0)
			return m
		}},
		{"expires_at_ms", func() wire.Message { m := first[*LeaseOfferV1](t); m.ExpiresAtMs = 0; return m }},
		{"ttl_ms", func() wire.Message { m := first[*LeaseOfferV1](t); m.TTLMs = 0; return m }},
		{"epoch", func() wire.Message { m := first[*LeaseOfferV1](t); m.Epoch = 0; return m }},
		{"payload_ref", func() wire.Message { m := first[*LeaseOfferV1](t); m.PayloadRef.Algorithm = 5; return m }},
		{"reason", func() wire.Message { m := first[*LeaseRejectedV1](t); m.Reason = 7; return m }},
		{"message", func() wire.Message { m := first[*LeaseRejectedV1](t); m.Message = "\xed\xa0\x80"; return m }},
		{"observed_phase", func() wire.Message { m := first[*LeaseRenewV1](t); m.ObservedPhase = 3; return m }},
		{"outcome", func() wire.Message { m := first[*LeaseRenewAckV1](t); m.Outcome.TTLMs = 0; return m }},
		{"outcome", func() wire.Message { m := first[*LeaseRenewAckV1](t); m.Outcome.Reason = CancelOther; return m }},
		{"outcome", func() wire.Message {
			m := first[*LeaseRenewAckV1](t)
			m.Outcome = RenewOutcomeV1{Kind: RenewRevoked, Reason: CancelTimeout, ExpiresAtMs: 5}
			return m
		}},
		{"outcome", func() wire.Message {
			m := first[*LeaseRenewAckV1](t)
			m.Outcome = RenewOutcomeV1{Kind: RenewUnknown, TTLMs: 5}
			return m
		}},
		{"outcome", func() wire.Message { m := first[*LeaseRenewAckV1](t); m.Outcome = RenewOutcomeV1{Kind: 3}; return m }},
		{"reason", func() wire.Message { m := first[*CancelAttemptV1](t); m.Reason = 7; return m }},
		{"phase", func() wire.Message { m := first[*PhaseChangeV1](t); m.Phase = 3; return m }},
		{"at_ms", func() wire.Message { m := first[*PhaseChangeV1](t); m.AtMs = 0; return m }},
		{"result", func() wire.Message { m := first[*AttemptCompletionV1](t); m.Result.Message = "x"; return m }},
		{"result", func() wire.Message {
			m := first[*AttemptCompletionV1](t)
			m.Result = ExecutionResultV1{Kind: ResultCancelled, ExitCode: 1}
			return m
		}},
		{"result", func() wire.Message {
			m := first[*AttemptCompletionV1](t)
			m.Result = ExecutionResultV1{Kind: ResultInfraError, ExitCode: 1, Message: "m"}
			return m
		}},
		{"result", func() wire.Message {
			m := first[*AttemptCompletionV1](t)
			m.Result = ExecutionResultV1{Kind: ResultFailed, Message: "\xff"}
			return m
		}},
		{"result", func() wire.Message { m := first[*AttemptCompletionV1](t); m.Result.Kind = 5; return m }},
		{"outputs", func() wire.Message { m := first[*AttemptCompletionV1](t); m.Outputs[0].Algorithm = 2; return m }},
		{"kind", func() wire.Message { m := first[*CompletionAckV1](t); m.Kind = 4; return m }},
		{"server_time_ms", func() wire.Message { m := first[*HeartbeatAckV1](t); m.ServerTimeMs = 0; return m }},
		{"epoch", func() wire.Message { m := first[*AgentResyncV1](t); m.Epoch = 0; return m }},
		{"active_attempts.epoch", func() wire.Message { m := first[*AgentResyncV1](t); m.ActiveAttempts[0].Epoch = 0; return m }},
		{"active_attempts.phase", func() wire.Message { m := first[*AgentResyncV1](t); m.ActiveAttempts[0].Phase = 3; return m }},
		{"active_attempts.completion", func() wire.Message {
			m := first[*AgentResyncV1](t)
			m.ActiveAttempts[1].HasCompletion = false
			return m
		}},
		{"active_attempts.attempt", func() wire.Message {
			m := first[*AgentResyncV1](t)
			m.ActiveAttempts[1].Attempt = m.ActiveAttempts[0].Attempt
			return m
		}},
		{"results.decision", func() wire.Message { m := first[*ResyncResponseV1](t); m.Results[0].Decision.TTLMs = 0; return m }},
		{"results.decision", func() wire.Message {
			m := first[*ResyncResponseV1](t)
			m.Results[1].Decision.ExpiresAtMs = 1
			return m
		}},
		{"results.decision", func() wire.Message {
			m := first[*ResyncResponseV1](t)
			m.Results[2].Decision.Reason = CancelOther
			return m
		}},
		{"results.decision", func() wire.Message { m := first[*ResyncResponseV1](t); m.Results[0].Decision.Kind = 3; return m }},
		{"results.attempt", func() wire.Message {
			m := first[*ResyncResponseV1](t)
			m.Results[2].Attempt = m.Results[0].Attempt
			return m
		}},
		{"alternate_endpoints", func() wire.Message {
			m := first[*GoAwayV1](t)
			m.AlternateEndpoints = append(m.AlternateEndpoints, m.AlternateEndpoints[0])
			return m
		}},
		{"message", func() wire.Message { m := first[*GoAwayV1](t); m.Message = "\xff"; return m }},
		{"server_time_ms", func() wire.Message { m := first[*ServerTimeV1](t); m.ServerTimeMs = 0; return m }},
		{"holder_transport", func() wire.Message {
			m := first[*SessionFencedV1](t)
			m.HolderTransport = m.FencedTransport
			return m
		}},
		{"holder_epoch", func() wire.Message { m := first[*SessionFencedV1](t); m.HolderEpoch = 0; return m }},
		{"grace_until_ms", func() wire.Message { m := first[*LeaseProbeV1](t); m.GraceUntilMs = 0; return m }},
		{"secret_id", func() wire.Message { m := first[*SecretMaterialV1](t); m.SecretID = ""; return m }},
		{"bytes", func() wire.Message { m := first[*SecretMaterialV1](t); m.Bytes = nil; return m }},
		{"expires_at_ms", func() wire.Message { m := first[*SecretMaterialV1](t); m.ExpiresAtMs = 0; return m }},
	}
	for i, c := range cases {
		m := c.mutate()
		err := m.Validate()
		var ve *ValidationError
		if !errors.As(err, &ve) {
			t.Errorf("case %d %s.%s: Validate = %v, want a *ValidationError", i, nameOf(m), c.field, err)
			continue
		}
		if ve.Field != c.field || ve.Message != "agent."+nameOf(m) {
			t.Errorf("case %d: error names %s.%s, want agent.%s.%s (%v)", i, ve.Message, ve.Field, nameOf(m), c.field, err)
		}
		if !strings.Contains(err.Error(), c.field) {
			t.Errorf("case %d: error text %q does not name the field", i, err)
		}
	}
}

// The bounds are the ones the brief freezes.
func TestBoundConstants(t *testing.T) {
	got := []int{MaxAgentVersion, MaxOSName, MaxArchName, MaxLabel, MaxLabels, MaxTool, MaxTools, MaxKeyProof,
		MaxEndpoint, MaxAlternateEndpoints, MaxFallbackStagger, MaxRejectMessage, MaxMessage, MaxOutputs,
		MaxRemoteAddr, MaxSecretID, MaxSecretBytes, MaxActiveAttempts, MaxCertChain, MaxCertDER}
	want := []int{64, 32, 32, 64, 64, 64, 64, 512, 256, 16, 8, 512, 256, 1024, 128, 128, 61440, 256, 4, 8192}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("bounds %v, want %v", got, want)
	}
}

func TestHeartbeatValidate(t *testing.T) {
	m := first[*HeartbeatV1](t)
	m.CapabilityDigest = wire.CapabilityDigest{}
	if err := m.Validate(); err != nil {
		t.Errorf("zero capability digest must stay valid (shared vector heartbeat/idle): %v", err)
	}
	m.ActiveAttempts[0].Phase = 3
	var ve *ValidationError
	if err := m.Validate(); !errors.As(err, &ve) || ve.Field != "active_attempts.phase" {
		t.Errorf("unknown phase: %v", err)
	}
	m.ActiveAttempts = make([]ActiveAttemptV1, MaxActiveAttempts+1)
	if err := m.Validate(); !errors.As(err, &ve) || ve.Field != "active_attempts" {
		t.Errorf("too many attempts: %v", err)
	}
}
