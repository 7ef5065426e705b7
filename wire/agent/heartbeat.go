package agent

import (
	"log/slog"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/enum"
	"forgeyard.dev/transport/wire/internal/seq"
	"forgeyard.dev/transport/wire/postcard"
)

// MaxActiveAttempts bounds the attempts listed in a heartbeat or resync.
const MaxActiveAttempts = 256

// checkAttemptList validates a per-attempt list (HeartbeatV1's and
// AgentResyncV1's active_attempts, ResyncResponseV1's results): at most
// MaxActiveAttempts elements, each valid by check, and, when attemptOf is
// not nil, no attempt listed twice.
func checkAttemptList[T any](msg, field string, list []T, check func(*T, string) error, attemptOf func(*T) wire.JobAttemptId) error {
	if len(list) > MaxActiveAttempts {
		return invalid(msg, field, "more elements than its bound")
	}
	for i := range list {
		if err := check(&list[i], msg); err != nil {
			return err
		}
		if attemptOf == nil {
			continue
		}
		a := attemptOf(&list[i])
		for j := range list[:i] {
			if attemptOf(&list[j]) == a {
				return invalid(msg, field+".attempt", "listed twice")
			}
		}
	}
	return nil
}

// AttemptPhase is an attempt's execution phase (§74). Postcard enum.
type AttemptPhase uint32

// Attempt phases.
const (
	PhasePreparing        AttemptPhase = 0
	PhaseRunning          AttemptPhase = 1
	PhaseUploadingOutputs AttemptPhase = 2

	numPhases = 3
)

// String returns the variant name, or "AttemptPhase(n)" for a value this build
// does not define.
func (p AttemptPhase) String() string { return enum.Name(attemptPhaseNames[:], p, "AttemptPhase") }

var attemptPhaseNames = [...]string{
	PhasePreparing: "Preparing", PhaseRunning: "Running",
	PhaseUploadingOutputs: "UploadingOutputs",
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (p AttemptPhase) LogValue() slog.Value { return slog.StringValue(p.String()) }

// ActiveAttemptV1 is one attempt reported in a heartbeat:
//
//	struct ActiveAttemptV1 { attempt: [u8;16], lease: [u8;16], phase: AttemptPhase, log_seq: u64 }
type ActiveAttemptV1 struct {
	Attempt wire.JobAttemptId
	Lease   wire.LeaseId
	Phase   AttemptPhase
	LogSeq  uint64
}

const activeAttemptMinSize = 16 + 16 + 1 + 1

func (a *ActiveAttemptV1) appendPostcard(b []byte) []byte {
	return appendAttemptPhase(b, &a.Attempt, &a.Lease, a.Phase, a.LogSeq)
}

func (a *ActiveAttemptV1) decodePostcard(d *postcard.Decoder) {
	a.LogSeq = decodeAttemptPhase(d, &a.Attempt, &a.Lease, &a.Phase)
}

func (a *ActiveAttemptV1) validate(msg string) error {
	if err := checkIDs(msg, idField{"active_attempts.attempt", a.Attempt.ULID},
		idField{"active_attempts.lease", a.Lease.ULID}); err != nil {
		return err
	}
	if !a.Phase.Valid() {
		return invalid(msg, "active_attempts.phase", "unknown phase")
	}
	return nil
}

// ResourceSummaryV1 is a coarse resource report (§80):
//
//	struct ResourceSummaryV1 { cpu_millis: u32, mem_bytes: u64, disk_bytes: u64, running_jobs: u16 }
type ResourceSummaryV1 struct {
	CPUMillis   uint32
	MemBytes    uint64
	DiskBytes   uint64
	RunningJobs uint16
}

// HeartbeatV1 is the agent's periodic liveness and state report (§80–82).
// Seq increases by one per heartbeat of one agent session, so the daemon can
// drop out-of-order duplicates.
//
//	struct HeartbeatV1 {
//	    runner: [u8;16], session: [u8;16], seq: u64,
//	    active_attempts: Vec<ActiveAttemptV1>,   // ≤ 256
//	    capability_digest: [u8;32],
//	    resources: ResourceSummaryV1,
//	}
type HeartbeatV1 struct {
	Runner           wire.RunnerId
	Session          wire.AgentSessionId
	Seq              uint64
	ActiveAttempts   []ActiveAttemptV1
	CapabilityDigest wire.CapabilityDigest
	Resources        ResourceSummaryV1
}

// MessageType implements wire.Message.
func (*HeartbeatV1) MessageType() wire.MessageTypeId { return MsgHeartbeat }

// AppendPostcard implements wire.Message.
func (m *HeartbeatV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Runner.ULID[:]...)
	b = append(b, m.Session.ULID[:]...)
	b = postcard.AppendU64(b, m.Seq)
	b = seq.Append(b, m.ActiveAttempts, (*ActiveAttemptV1).appendPostcard)
	b = append(b, m.CapabilityDigest.Digest[:]...)
	b = postcard.AppendU32(b, m.Resources.CPUMillis)
	b = postcard.AppendU64(b, m.Resources.MemBytes)
	b = postcard.AppendU64(b, m.Resources.DiskBytes)
	return postcard.AppendU16(b, m.Resources.RunningJobs)
}

// DecodePostcard implements wire.Message. It reuses the capacity of
// m.ActiveAttempts, so decoding into the same value allocates nothing.
func (m *HeartbeatV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Runner.ULID)
	wire.ReadULID(d, &m.Session.ULID)
	m.Seq = d.U64()
	for a := range seq.Decode(d, &m.ActiveAttempts, MaxActiveAttempts, activeAttemptMinSize) {
		a.decodePostcard(d)
	}
	wire.ReadDigest(d, &m.CapabilityDigest.Digest)
	m.Resources.CPUMillis = d.U32()
	m.Resources.MemBytes = d.U64()
	m.Resources.DiskBytes = d.U64()
	m.Resources.RunningJobs = d.U16()
}

// Validate implements wire.Message: non-zero runner and session, at most
// MaxActiveAttempts attempts, each with non-zero ids and a known phase. A
// zero capability digest is allowed (an idle agent may not have one yet).
func (m *HeartbeatV1) Validate() error {
	const n = "agent.HeartbeatV1"
	if err := checkIDs(n, idField{"runner", m.Runner.ULID}, idField{"session", m.Session.ULID}); err != nil {
		return err
	}
	return checkAttemptList(n, "active_attempts", m.ActiveAttempts, (*ActiveAttemptV1).validate, nil)
}
