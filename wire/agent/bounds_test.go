package agent

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

// first returns a fresh copy of the first sample of type T.
func first[T wire.Message](t testing.TB) T {
	t.Helper()
	for _, m := range Samples() {
		if v, ok := m.(T); ok {
			return v
		}
	}
	var zero T
	t.Fatalf("no sample of type %T", zero)
	return zero
}

// noTruncate makes the encoder write free-text fields as they are, so tests
// can produce over-bound encodings.
func noTruncate(t *testing.T) {
	truncateText = func(s string, _ int) string { return s }
	t.Cleanup(func() { truncateText = wire.TruncateUTF8 })
}

func distinct(n, size int) []string {
	out := make([]string, n)
	for i := range out {
		p := fmt.Sprintf("%04d", i)
		out[i] = p + strings.Repeat("s", size-len(p))
	}
	return out
}

// Every bounded string, byte string and sequence, one past its bound, fails
// to decode with ErrLengthOverBound; the non-free-text ones also fail
// Validate.
func TestOverBoundFails(t *testing.T) {
	noTruncate(t)
	long := func(n int) string { return strings.Repeat("x", n+1) }
	cases := []struct {
		name     string
		build    func() wire.Message
		validate bool // Validate must reject it too
	}{
		{"hello.agent_version", func() wire.Message {
			m := first[*TransportHelloV1](t)
			m.AgentVersion = long(MaxAgentVersion)
			return m
		}, true},
		{"register.agent_version", func() wire.Message {
			m := first[*RegisterAgentV1](t)
			m.AgentVersion = long(MaxAgentVersion)
			return m
		}, true},
		{"register.os", func() wire.Message {
			m := first[*RegisterAgentV1](t)
			m.Capabilities.OS = long(MaxOSName)
			return m
		}, true},
		{"register.arch", func() wire.Message {
			m := first[*RegisterAgentV1](t)
			m.Capabilities.Arch = long(MaxArchName)
			return m
		}, true},
		{"register.labels", func() wire.Message {
			m := first[*RegisterAgentV1](t)
			m.Capabilities.Labels = distinct(MaxLabels+1, 8)
			return m
		}, true},
		{"register.label", func() wire.Message {
			m := first[*RegisterAgentV1](t)
			m.Capabilities.Labels = []string{long(MaxLabel)}
			return m
		}, true},
		{"register.tools", func() wire.Message {
			m := first[*RegisterAgentV1](t)
			m.Capabilities.Tools = distinct(MaxTools+1, 8)
			return m
		}, true},
		{"register.tool", func() wire.Message {
			m := first[*RegisterAgentV1](t)
			m.Capabilities.Tools = []string{"a", long(MaxTool)}
			return m
		}, true},
		{"register.key_proof", func() wire.Message {
			m := first[*RegisterAgentV1](t)
			m.KeyProof = make([]byte, MaxKeyProof+1)
			return m
		}, true},
		{"capability_update.labels", func() wire.Message {
			m := first[*CapabilityUpdateV1](t)
			m.Full.Labels = distinct(MaxLabels+1, 5)
			return m
		}, true},
		{"accepted.alternate_endpoints", func() wire.Message {
			m := first[*RegistrationAcceptedV1](t)
			m.AlternateEndpoints = distinct(MaxAlternateEndpoints+1, 20)
			return m
		}, true},
		{"accepted.endpoint", func() wire.Message {
			m := first[*RegistrationAcceptedV1](t)
			m.AlternateEndpoints = []string{long(MaxEndpoint)}
			return m
		}, true},
		{"accepted.fallback_stagger_ms", func() wire.Message {
			m := first[*RegistrationAcceptedV1](t)
			m.FallbackStaggerMs = make([]uint32, MaxFallbackStagger+1)
			return m
		}, true},
		{"rejected.message", func() wire.Message {
			m := first[*RegistrationRejectedV1](t)
			m.Message = long(MaxRejectMessage)
			return m
		}, false},
		{"lease_rejected.message", func() wire.Message {
			m := first[*LeaseRejectedV1](t)
			m.Message = long(MaxMessage)
			return m
		}, false},
		{"cancel.message", func() wire.Message {
			m := first[*CancelAttemptV1](t)
			m.Message = long(MaxMessage)
			return m
		}, false},
		{"completion.failed.message", func() wire.Message {
			m := first[*AttemptCompletionV1](t)
			m.Result = ExecutionResultV1{Kind: ResultFailed, ExitCode: 1, Message: long(MaxMessage)}
			return m
		}, false},
		{"completion.infra_error.message", func() wire.Message {
			m := first[*AttemptCompletionV1](t)
			m.Result = ExecutionResultV1{Kind: ResultInfraError, Message: long(MaxMessage)}
			return m
		}, false},
		{"completion.outputs", func() wire.Message {
			m := first[*AttemptCompletionV1](t)
			m.Outputs = make([]wire.CasObjectRef, MaxOutputs+1)
			for i := range m.Outputs {
				m.Outputs[i] = wire.CasObjectRef{Algorithm: wire.DigestBLAKE3, Digest: sampleDigest(1)}
			}
			return m
		}, true},
		{"completion_ack.message", func() wire.Message {
			m := first[*CompletionAckV1](t)
			m.Message = long(MaxMessage)
			return m
		}, false},
		{"heartbeat.active_attempts", func() wire.Message {
			m := first[*HeartbeatV1](t)
			m.ActiveAttempts = make([]ActiveAttemptV1, MaxActiveAttempts+1)
			return m
		}, true},
		{"resync.active_attempts", func() wire.Message {
			m := first[*AgentResyncV1](t)
			m.ActiveAttempts = make([]ActiveAttemptResyncV1, MaxActiveAttempts+1)
			return m
		}, true},
		{"resync_response.results", func() wire.Message {
			m := first[*ResyncResponseV1](t)
			m.Results = make([]ResyncResultV1, MaxActiveAttempts+1)
			return m
		}, true},
		{"goaway.alternate_endpoints", func() wire.Message {
			m := first[*GoAwayV1](t)
			m.AlternateEndpoints = distinct(MaxAlternateEndpoints+1, 20)
			return m
		}, true},
		{"goaway.endpoint", func() wire.Message {
			m := first[*GoAwayV1](t)
			m.AlternateEndpoints = []string{long(MaxEndpoint)}
			return m
		}, true},
		{"goaway.message", func() wire.Message {
			m := first[*GoAwayV1](t)
			m.Message = long(MaxMessage)
			return m
		}, false},
		{"fenced.holder_remote", func() wire.Message {
			m := first[*SessionFencedV1](t)
			m.HolderRemote = long(MaxRemoteAddr)
			return m
		}, true},
		{"secret.secret_id", func() wire.Message {
			m := first[*SecretMaterialV1](t)
			m.SecretID = long(MaxSecretID)
			return m
		}, true},
		{"secret.bytes", func() wire.Message {
			m := first[*SecretMaterialV1](t)
			m.Bytes = make(SecretBytes, MaxSecretBytes+1)
			return m
		}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := c.build()
			_, err := decodeAs(t, m, m.AppendPostcard(nil))
			if !errors.Is(err, postcard.ErrLengthOverBound) {
				t.Errorf("decode: %v, want ErrLengthOverBound", err)
			}
			if err := m.Validate(); c.validate && err == nil {
				t.Error("Validate accepts the over-bound value")
			}
		})
	}
}

// A discriminant past the last variant of every enum field fails to decode
// with ErrBadEnum and fails Validate.
func TestBadEnumFails(t *testing.T) {
	cases := []struct {
		name  string
		build func() wire.Message
	}{
		{"hello.role", func() wire.Message { m := first[*TransportHelloV1](t); m.Role = numPeerRoles; return m }},
		{"hello.role.huge", func() wire.Message { m := first[*TransportHelloV1](t); m.Role = math.MaxUint32; return m }},
		{"rejected.retry", func() wire.Message {
			m := first[*RegistrationRejectedV1](t)
			m.Retry = wire.RetryClass(numRetryClasses)
			return m
		}},
		{"offer.payload_ref.algorithm", func() wire.Message {
			m := first[*LeaseOfferV1](t)
			m.PayloadRef.Algorithm = 2
			return m
		}},
		{"lease_rejected.reason", func() wire.Message {
			m := first[*LeaseRejectedV1](t)
			m.Reason = numLeaseRejectReasons
			return m
		}},
		{"renew.observed_phase", func() wire.Message { m := first[*LeaseRenewV1](t); m.ObservedPhase = numPhases; return m }},
		{"renew_ack.outcome", func() wire.Message {
			m := first[*LeaseRenewAckV1](t)
			m.Outcome = RenewOutcomeV1{Kind: numRenewOutcomes}
			return m
		}},
		{"renew_ack.outcome.revoked.reason", func() wire.Message {
			m := first[*LeaseRenewAckV1](t)
			m.Outcome = RenewOutcomeV1{Kind: RenewRevoked, Reason: numCancellationReasons}
			return m
		}},
		{"cancel.reason", func() wire.Message {
			m := first[*CancelAttemptV1](t)
			m.Reason = numCancellationReasons
			return m
		}},
		{"phase_change.phase", func() wire.Message { m := first[*PhaseChangeV1](t); m.Phase = numPhases; return m }},
		{"completion.result", func() wire.Message {
			m := first[*AttemptCompletionV1](t)
			m.Result = ExecutionResultV1{Kind: numExecutionResults}
			return m
		}},
		{"completion.outputs.algorithm", func() wire.Message {
			m := first[*AttemptCompletionV1](t)
			m.Outputs[1].Algorithm = 7
			return m
		}},
		{"completion_ack.kind", func() wire.Message {
			m := first[*CompletionAckV1](t)
			m.Kind = numCompletionAckKinds
			return m
		}},
		{"heartbeat.active_attempts.phase", func() wire.Message {
			m := first[*HeartbeatV1](t)
			m.ActiveAttempts[1].Phase = numPhases
			return m
		}},
		{"resync.active_attempts.phase", func() wire.Message {
			m := first[*AgentResyncV1](t)
			m.ActiveAttempts[1].Phase = numPhases
			return m
		}},
		{"resync_response.decision", func() wire.Message {
			m := first[*ResyncResponseV1](t)
			m.Results[2].Decision = ResyncDecisionV1{Kind: numResyncDecisions}
			return m
		}},
		{"resync_response.decision.cancel.reason", func() wire.Message {
			m := first[*ResyncResponseV1](t)
			m.Results[1].Decision.Reason = numCancellationReasons
			return m
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := c.build()
			_, err := decodeAs(t, m, m.AppendPostcard(nil))
			if !errors.Is(err, postcard.ErrBadEnum) {
				t.Errorf("decode: %v, want ErrBadEnum", err)
			}
			if m.Validate() == nil {
				t.Error("Validate accepts the unknown enum value")
			}
		})
	}
}

// maximal returns, per message type, a value whose every field takes its
// longest canonical encoding.
func maximal() []wire.Message {
	const u64, u32, u16 = math.MaxUint64, math.MaxUint32, math.MaxUint16
	str := func(n int) string { return strings.Repeat("m", n) }
	allFeatures := wire.FeatureSet(math.MaxUint64)
	rng := wire.ProtocolRange{Min: wire.V(u16, u16), Max: wire.V(u16, u16)}
	caps := RunnerCapabilitiesV1{
		OS: str(MaxOSName), Arch: str(MaxArchName),
		Labels: distinct(MaxLabels, MaxLabel), MaxParallel: u16, CPUMillis: u32, MemBytes: u64, DiskBytes: u64,
		Tools: distinct(MaxTools, MaxTool),
	}
	cas := wire.CasObjectRef{Algorithm: wire.DigestBLAKE3, Digest: sampleDigest(1), Size: u64}
	outputs := make([]wire.CasObjectRef, MaxOutputs)
	for i := range outputs {
		outputs[i] = cas
	}
	stagger := make([]uint32, MaxFallbackStagger)
	for i := range stagger {
		stagger[i] = u32
	}
	hb := make([]ActiveAttemptV1, MaxActiveAttempts)
	for i := range hb {
		hb[i] = ActiveAttemptV1{Attempt: sAttempt, Lease: sLease, Phase: PhaseUploadingOutputs, LogSeq: u64}
	}
	rs := make([]ActiveAttemptResyncV1, MaxActiveAttempts)
	res := make([]ResyncResultV1, MaxActiveAttempts)
	for i := range rs {
		att := sAttempt
		att.ULID[15] = byte(i)
		rs[i] = ActiveAttemptResyncV1{Attempt: att, Lease: sLease, Epoch: u64, Phase: PhaseUploadingOutputs,
			LogSeq: u64, HasCompletion: true, Completion: sMessage}
		res[i] = ResyncResultV1{Attempt: att, Lease: sLease,
			Decision: ResyncDecisionV1{Kind: DecisionContinue, ExpiresAtMs: u64, TTLMs: u32}}
	}
	endpoints := distinct(MaxAlternateEndpoints, MaxEndpoint)
	return []wire.Message{
		&TransportHelloV1{Role: RoleInternalWorker, Versions: rng, Features: allFeatures, HasAgentSession: true,
			AgentSession: sSession, AgentVersion: str(MaxAgentVersion)},
		&HelloAckV1{Negotiated: wire.V(u16, u16), ServerRange: rng, Features: allFeatures, TransportSession: sTransport,
			ServerTimeMs: u64, Challenge: sampleDigest(3)},
		&RegisterAgentV1{Runner: sRunner, Session: sSession, AgentVersion: str(MaxAgentVersion), Capabilities: caps,
			CapabilityDigest: sCapDigest, KeyProof: make([]byte, MaxKeyProof), HasResumeEpoch: true, ResumeEpoch: u64,
			CertChain: [][]byte{make([]byte, MaxCertDER), make([]byte, MaxCertDER), make([]byte, MaxCertDER), make([]byte, MaxCertDER)}},
		&RegistrationAcceptedV1{Session: sSession, Epoch: u64, TransportSession: sTransport, HeartbeatIntervalMs: u32,
			LeaseRenewIntervalMs: u32, MaxBackoffMs: u32, AlternateEndpoints: endpoints, FallbackStaggerMs: stagger,
			ServerTimeMs: u64},
		&RegistrationRejectedV1{Code: u16, Retry: wire.RetryUnsupported, Message: str(MaxRejectMessage),
			HasServerRange: true, ServerRange: rng},
		&LeaseOfferV1{Lease: sLease, Attempt: sAttempt, Job: sJob, SpecID: sSpec, ExpiresAtMs: u64, TTLMs: u32,
			PayloadRef: cas, Session: sSession, Epoch: u64},
		&LeaseAcceptedV1{Lease: sLease, Attempt: sAttempt, Session: sSession},
		&LeaseRejectedV1{Lease: sLease, Attempt: sAttempt, Reason: RejectOther, Message: str(MaxMessage)},
		&LeaseRenewV1{Lease: sLease, Attempt: sAttempt, ObservedPhase: PhaseUploadingOutputs},
		&LeaseRenewAckV1{Lease: sLease, Attempt: sAttempt, Outcome: RenewOutcomeV1{Kind: RenewExtended, ExpiresAtMs: u64, TTLMs: u32}},
		&CancelAttemptV1{Attempt: sAttempt, Lease: sLease, Reason: CancelOther, Message: str(MaxMessage)},
		&CancelAckV1{Attempt: sAttempt, Lease: sLease},
		&PhaseChangeV1{Attempt: sAttempt, Lease: sLease, Phase: PhaseUploadingOutputs, AtMs: u64},
		&AttemptCompletionV1{Job: sJob, Attempt: sAttempt, Lease: sLease, Spec: sSpec,
			Result:  ExecutionResultV1{Kind: ResultFailed, ExitCode: math.MinInt32, Message: str(MaxMessage)},
			Outputs: outputs, LogLastSeq: u64},
		&CompletionAckV1{Attempt: sAttempt, Lease: sLease, Kind: AckInvalidRejected, Message: str(MaxMessage)},
		&HeartbeatV1{Runner: sRunner, Session: sSession, Seq: u64, ActiveAttempts: hb, CapabilityDigest: sCapDigest,
			Resources: ResourceSummaryV1{CPUMillis: u32, MemBytes: u64, DiskBytes: u64, RunningJobs: u16}},
		&HeartbeatAckV1{Seq: u64, ServerTimeMs: u64},
		&AgentResyncV1{Session: sSession, Epoch: u64, ActiveAttempts: rs, CapabilityDigest: sCapDigest, LastEventSeq: u64},
		&ResyncResponseV1{Results: res},
		&CapabilityUpdateV1{Digest: sCapDigest, Full: caps},
		&GoAwayV1{Code: u32, ReconnectInMs: u32, TryForMs: u32, AlternateEndpoints: endpoints, Message: str(MaxMessage)},
		&ServerTimeV1{ServerTimeMs: u64},
		&SessionFencedV1{Session: sSession, FencedTransport: sOldTrans, HolderTransport: sTransport, HolderEpoch: u64,
			HolderRemote: str(MaxRemoteAddr), ResolvesWithinMs: u32},
		&LeaseProbeV1{Lease: sLease, Attempt: sAttempt, GraceUntilMs: u64},
		&SecretMaterialV1{Lease: sLease, SecretID: str(MaxSecretID), Bytes: make(SecretBytes, MaxSecretBytes), ExpiresAtMs: u64},
		&CertificateRequestV1{Token: str(MaxEnrollToken), CSR: make([]byte, MaxCSR)},
		&CertificateIssuedV1{Runner: sRunner, NotAfterMs: u64,
			CertChain: [][]byte{make([]byte, MaxCertDER), make([]byte, MaxCertDER), make([]byte, MaxCertDER), make([]byte, MaxCertDER)}},
		&RegistrationDeferredV1{Code: 0xffff, RetryAfterMs: MaxRetryAfterMs, Message: str(MaxRejectMessage)},
		&RestartTokenV1{TransportSession: sTransport, KeyID: [4]byte{0xff, 0xff, 0xff, 0xff}, Token: [16]byte{0: 0xff, 15: 0xff}},
	}
}

// MaxSize bounds every maximal value, and is exact where the encoder can
// reach the decoder's bound (a FeatureSet this build encodes uses one byte
// per feature; the decoder allows three, for a newer peer's numbers).
func TestMaxSize(t *testing.T) {
	seen := map[wire.MessageTypeId]bool{}
	for _, m := range maximal() {
		seen[m.MessageType()] = true
		mi := infoOf(t, m)
		if err := m.Validate(); err != nil {
			t.Errorf("%s: maximal value is invalid: %v", mi.Name, err)
		}
		enc := m.AppendPostcard(nil)
		if _, err := decodeAs(t, m, enc); err != nil {
			t.Errorf("%s: maximal value does not decode: %v", mi.Name, err)
		}
		switch m.(type) {
		case *TransportHelloV1, *HelloAckV1:
			if len(enc) > mi.MaxSize {
				t.Errorf("%s: maximal encoding %d bytes > MaxSize %d", mi.Name, len(enc), mi.MaxSize)
			}
			if slack := featuresMax - (1 + 64); len(enc)+slack != mi.MaxSize {
				t.Errorf("%s: maximal encoding %d bytes + FeatureSet slack %d != MaxSize %d", mi.Name, len(enc), slack, mi.MaxSize)
			}
		default:
			if len(enc) != mi.MaxSize {
				t.Errorf("%s: maximal encoding %d bytes, MaxSize %d", mi.Name, len(enc), mi.MaxSize)
			}
		}
	}
	for _, mi := range Messages {
		if !seen[mi.Type] {
			t.Errorf("%s has no maximal value", mi.Name)
		}
	}
}

// The registry refuses a body longer than MaxSize before decoding it.
func TestRegistryRefusesOverMaxSize(t *testing.T) {
	r := wire.MustRegistry(Messages)
	m := first[*LeaseAcceptedV1](t)
	payload := append(wire.AppendMessage(nil, m), 0)
	d := postcard.NewDecoder(payload)
	if _, err := r.DecodeMessage(&d); !errors.Is(err, postcard.ErrLengthOverBound) {
		t.Errorf("body over MaxSize: %v, want ErrLengthOverBound", err)
	}
}

// Every agent message travels on the control stream, so at its MaxSize it
// must fit one control frame with the envelope header and the two-byte
// family/variant prefix. (SecretMaterialV1 travels on its own stream kind,
// with the same frame limit, so its 60 KiB bound keeps it within one frame.)
func TestMessagesFitControlFrame(t *testing.T) {
	for _, mi := range Messages {
		need := wire.EnvelopeHeaderMaxSize + 2 + mi.MaxSize
		if need > wire.MaxControlFrame {
			t.Errorf("%s: %d bytes at MaxSize with envelope, control frame limit %d", mi.Name, need, wire.MaxControlFrame)
		}
	}
}
