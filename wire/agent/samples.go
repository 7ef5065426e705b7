package agent

import (
	"github.com/oklog/ulid/v2"

	"forgeyard.dev/transport/wire"
)

// sampleTimeMs is the fixed instant of every sample: 2026-01-01T00:00:00Z.
const sampleTimeMs uint64 = 1767225600000

// sampleID returns a fixed ULID whose time part is sampleTimeMs and whose
// random part repeats tag, so samples are deterministic and their ids are
// recognisable in hex dumps.
func sampleID(tag byte) ulid.ULID {
	var u ulid.ULID
	_ = u.SetTime(sampleTimeMs)
	for i := 6; i < 16; i++ {
		u[i] = tag
	}
	return u
}

// sampleDigest returns a fixed digest: tag, tag+1, tag+2, …
func sampleDigest(tag byte) wire.Digest {
	var g wire.Digest
	for i := range g {
		g[i] = tag + byte(i)
	}
	return g
}

// Fixed identifiers shared by the samples, so that related messages (offer,
// accept, renew, completion) name the same lease and attempt.
var (
	sRunner    = wire.RunnerId{ULID: sampleID(0x11)}
	sSession   = wire.AgentSessionId{ULID: sampleID(0x22)}
	sTransport = wire.TransportSessionId{ULID: sampleID(0x33)}
	sOldTrans  = wire.TransportSessionId{ULID: sampleID(0x34)}
	sLease     = wire.LeaseId{ULID: sampleID(0x44)}
	sLease2    = wire.LeaseId{ULID: sampleID(0x45)}
	sLease3    = wire.LeaseId{ULID: sampleID(0x46)}
	sAttempt   = wire.JobAttemptId{ULID: sampleID(0x55)}
	sAttempt2  = wire.JobAttemptId{ULID: sampleID(0x56)}
	sAttempt3  = wire.JobAttemptId{ULID: sampleID(0x57)}
	sJob       = wire.JobId{ULID: sampleID(0x66)}
	sMessage   = wire.MessageId{ULID: sampleID(0x77)}
	sSpec      = wire.JobSpecId{Digest: sampleDigest(0xa0)}
	sCapDigest = wire.CapabilityDigest{Digest: sampleDigest(0xc0)}
)

func sampleCapabilities() RunnerCapabilitiesV1 {
	return RunnerCapabilitiesV1{
		OS:          "linux",
		Arch:        "amd64",
		Labels:      []string{"docker", "gpu", "region=eu-west-1"},
		MaxParallel: 4,
		CPUMillis:   16000,
		MemBytes:    64 << 30,
		DiskBytes:   1 << 40,
		Tools:       []string{"go1.26", "rustc1.95", "node22"},
	}
}

// Samples returns deterministic, fully populated, valid instances of every
// message type of the agent family, in type-number order, with extra
// instances so that every variant of every enum (and both states of every
// Option) appears at least once. Ids, digests and times are fixed; there is
// no randomness and no clock. Every call returns fresh values that the
// caller may modify. Golden vectors, fuzz seeds and the inspector demo are
// built from this list, so append new samples at the end of a type's group
// and never reorder existing ones.
func Samples() []wire.Message {
	out := []wire.Message{
		&TransportHelloV1{
			Role:            RoleAgent,
			Versions:        wire.ProtocolRange{Min: wire.V(1, 0), Max: wire.V(1, 3)},
			Features:        wire.Features(wire.FeatureLogResumeV1, wire.FeatureCasRangeResumeV1, wire.FeatureTraceContextV1),
			HasAgentSession: true,
			AgentSession:    sSession,
			AgentVersion:    "forgeyard-agent/1.4.2",
		},
	}
	for _, r := range []PeerRole{RoleDeviceAgent, RoleSigningWorker, RoleInternalWorker} {
		out = append(out, &TransportHelloV1{
			Role:         r,
			Versions:     wire.ProtocolRange{Min: wire.V(1, 0), Max: wire.V(1, 0)},
			Features:     wire.Features(wire.FeatureDeviceControlV1, wire.FeatureSigningV1),
			AgentVersion: "forgeyard-worker/0.9.0",
		})
	}
	out = append(out,
		&HelloAckV1{
			Negotiated:       wire.V(1, 0),
			ServerRange:      wire.ProtocolRange{Min: wire.V(1, 0), Max: wire.V(1, 0)},
			Features:         wire.Features(wire.FeatureLogResumeV1, wire.FeatureCasRangeResumeV1),
			TransportSession: sTransport,
			ServerTimeMs:     sampleTimeMs + 1,
			Challenge:        sampleDigest(0x80),
		},
		&RegisterAgentV1{
			Runner:           sRunner,
			Session:          sSession,
			AgentVersion:     "forgeyard-agent/1.4.2",
			Capabilities:     sampleCapabilities(),
			CapabilityDigest: sCapDigest,
			KeyProof:         sampleBytes(0x90, 64),
			HasResumeEpoch:   true,
			ResumeEpoch:      7,
		},
		&RegisterAgentV1{
			Runner:           sRunner,
			Session:          sSession,
			AgentVersion:     "forgeyard-agent/1.4.2",
			Capabilities:     RunnerCapabilitiesV1{OS: "darwin", Arch: "arm64", MaxParallel: 1},
			CapabilityDigest: sCapDigest,
			KeyProof:         sampleBytes(0x91, 71),
			CertChain:        [][]byte{sampleBytes(0x30, 40), sampleBytes(0x31, 24)},
		},
		&RegistrationAcceptedV1{
			Session:              sSession,
			Epoch:                8,
			TransportSession:     sTransport,
			HeartbeatIntervalMs:  10000,
			LeaseRenewIntervalMs: 30000,
			MaxBackoffMs:         60000,
			AlternateEndpoints:   []string{"quic://daemon-b.forgeyard.example:443", "https://relay.forgeyard.example/.well-known/forgeyard/agent"},
			FallbackStaggerMs:    []uint32{0, 250, 1000},
			ServerTimeMs:         sampleTimeMs + 2,
		},
		&RegistrationRejectedV1{
			Code:           wire.ErrCodeUnsupportedVersion,
			Retry:          wire.RetryUnsupported,
			Message:        "no common protocol version: server supports 2.0–2.1, agent supports 1.0–1.3",
			HasServerRange: true,
			ServerRange:    wire.ProtocolRange{Min: wire.V(2, 0), Max: wire.V(2, 1)},
		},
	)
	for _, r := range []struct {
		code  wire.ProtocolErrorCode
		retry wire.RetryClass
	}{
		{wire.ErrCodeRunnerDisabled, wire.RetryNever},
		{wire.ErrCodeInternal, wire.RetryImmediately},
		{wire.ErrCodeOverloaded, wire.RetryBackoff},
		{wire.ErrCodeStaleSession, wire.RetryResync},
	} {
		out = append(out, &RegistrationRejectedV1{Code: r.code, Retry: r.retry, Message: "registration refused: " + r.code.String()})
	}
	out = append(out,
		&LeaseOfferV1{
			Lease:       sLease,
			Attempt:     sAttempt,
			Job:         sJob,
			SpecID:      sSpec,
			ExpiresAtMs: sampleTimeMs + 60000,
			TTLMs:       60000,
			PayloadRef:  wire.CasObjectRef{Algorithm: wire.DigestBLAKE3, Digest: sSpec.Digest, Size: 4096},
			Session:     sSession,
			Epoch:       8,
		},
		&LeaseAcceptedV1{Lease: sLease, Attempt: sAttempt, Session: sSession},
	)
	for r := LeaseRejectReason(0); r < numLeaseRejectReasons; r++ {
		out = append(out, &LeaseRejectedV1{Lease: sLease, Attempt: sAttempt, Reason: r, Message: "lease rejected: " + r.String()})
	}
	out = append(out, &LeaseRenewV1{Lease: sLease, Attempt: sAttempt, ObservedPhase: PhaseRunning})
	out = append(out,
		&LeaseRenewAckV1{Lease: sLease, Attempt: sAttempt,
			Outcome: RenewOutcomeV1{Kind: RenewExtended, ExpiresAtMs: sampleTimeMs + 120000, TTLMs: 60000}},
		&LeaseRenewAckV1{Lease: sLease, Attempt: sAttempt,
			Outcome: RenewOutcomeV1{Kind: RenewRevoked, Reason: CancelSuperseded}},
		&LeaseRenewAckV1{Lease: sLease, Attempt: sAttempt, Outcome: RenewOutcomeV1{Kind: RenewUnknown}},
	)
	for r := CancellationReason(0); r < numCancellationReasons; r++ {
		out = append(out, &CancelAttemptV1{Attempt: sAttempt, Lease: sLease, Reason: r, Message: "cancelled: " + r.String()})
	}
	out = append(out, &CancelAckV1{Attempt: sAttempt, Lease: sLease})
	for p := AttemptPhase(0); p < numPhases; p++ {
		out = append(out, &PhaseChangeV1{Attempt: sAttempt, Lease: sLease, Phase: p, AtMs: sampleTimeMs + 1000*uint64(p+1)})
	}
	results := []ExecutionResultV1{
		{Kind: ResultSucceeded, ExitCode: 0},
		{Kind: ResultFailed, ExitCode: -2, Message: "make: *** [test] Error 2"},
		{Kind: ResultCancelled},
		{Kind: ResultTimedOut},
		{Kind: ResultInfraError, Message: "disk full while uploading outputs"},
	}
	for i, r := range results {
		c := &AttemptCompletionV1{
			Job: sJob, Attempt: sAttempt, Lease: sLease, Spec: sSpec,
			Result:     r,
			LogLastSeq: 1234 + uint64(i),
		}
		if i == 0 {
			c.Outputs = []wire.CasObjectRef{
				{Algorithm: wire.DigestBLAKE3, Digest: sampleDigest(0x01), Size: 1 << 20},
				{Algorithm: wire.DigestSHA256, Digest: sampleDigest(0x02), Size: 0},
			}
		}
		out = append(out, c)
	}
	for k := CompletionAckKind(0); k < numCompletionAckKinds; k++ {
		out = append(out, &CompletionAckV1{Attempt: sAttempt, Lease: sLease, Kind: k, Message: "completion " + k.String()})
	}
	out = append(out,
		&HeartbeatV1{
			Runner:  sRunner,
			Session: sSession,
			Seq:     42,
			ActiveAttempts: []ActiveAttemptV1{
				{Attempt: sAttempt, Lease: sLease, Phase: PhaseRunning, LogSeq: 300},
				{Attempt: sAttempt2, Lease: sLease2, Phase: PhaseUploadingOutputs, LogSeq: 70000},
			},
			CapabilityDigest: sCapDigest,
			Resources:        ResourceSummaryV1{CPUMillis: 3500, MemBytes: 16 << 30, DiskBytes: 512 << 30, RunningJobs: 2},
		},
		&HeartbeatAckV1{Seq: 42, ServerTimeMs: sampleTimeMs + 3},
		&AgentResyncV1{
			Session: sSession,
			Epoch:   9,
			ActiveAttempts: []ActiveAttemptResyncV1{
				{Attempt: sAttempt, Lease: sLease, Epoch: 8, Phase: PhasePreparing, LogSeq: 0},
				{Attempt: sAttempt2, Lease: sLease2, Epoch: 8, Phase: PhaseUploadingOutputs, LogSeq: 70000,
					HasCompletion: true, Completion: sMessage},
			},
			CapabilityDigest: sCapDigest,
			LastEventSeq:     991,
		},
		&ResyncResponseV1{Results: []ResyncResultV1{
			{Attempt: sAttempt, Lease: sLease,
				Decision: ResyncDecisionV1{Kind: DecisionContinue, ExpiresAtMs: sampleTimeMs + 90000, TTLMs: 60000}},
			{Attempt: sAttempt2, Lease: sLease2, Decision: ResyncDecisionV1{Kind: DecisionCancel, Reason: CancelLeaseRevoked}},
			{Attempt: sAttempt3, Lease: sLease3, Decision: ResyncDecisionV1{Kind: DecisionStale}},
		}},
		&CapabilityUpdateV1{Digest: wire.CapabilityDigest{Digest: sampleDigest(0xc1)}, Full: sampleCapabilities()},
		&GoAwayV1{
			Code:               wire.CloseShutdown,
			ReconnectInMs:      1500,
			TryForMs:           300000,
			AlternateEndpoints: []string{"quic://daemon-b.forgeyard.example:443"},
			Message:            "daemon restarting for upgrade",
		},
		&ServerTimeV1{ServerTimeMs: sampleTimeMs + 4},
		&SessionFencedV1{
			Session:          sSession,
			FencedTransport:  sOldTrans,
			HolderTransport:  sTransport,
			HolderEpoch:      9,
			HolderRemote:     "203.0.113.7:51234",
			ResolvesWithinMs: 5000,
		},
		&LeaseProbeV1{Lease: sLease, Attempt: sAttempt, GraceUntilMs: sampleTimeMs + 15000},
		&SecretMaterialV1{
			Lease:       sLease,
			SecretID:    "ci/deploy-key",
			Bytes:       SecretBytes("sample-secret-not-real"),
			ExpiresAtMs: sampleTimeMs + 300000,
		},
		&CertificateRequestV1{Token: "fyet_SAMPLESAMPLESAMPLESAMPLESAMPLESAMPLESAMPLESAMPLESAMP", CSR: sampleBytes(0x30, 90)},
		&CertificateRequestV1{CSR: sampleBytes(0x31, 72)},
		&CertificateIssuedV1{Runner: sRunner, CertChain: [][]byte{sampleBytes(0x30, 48), sampleBytes(0x32, 40)}, NotAfterMs: sampleTimeMs + 30*86400000},
		&RegistrationDeferredV1{Code: wire.ErrCodeOverloaded, RetryAfterMs: 2750,
			Message: "registration rate limit (200/s burst 400) reached; retry after 2.75s"},
		&RestartTokenV1{TransportSession: sTransport, KeyID: [4]byte{0x5a, 0x1e, 0x7b, 0x02},
			Token: [16]byte(sampleBytes(0x40, 16))},
	)
	return out
}

// sampleBytes returns n bytes tag, tag+1, …
func sampleBytes(tag byte, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = tag + byte(i)
	}
	return p
}
