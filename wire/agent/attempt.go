package agent

import (
	"log/slog"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/enum"
	"forgeyard.dev/transport/wire/internal/maxsize"
	"forgeyard.dev/transport/wire/internal/seq"
	"forgeyard.dev/transport/wire/postcard"
)

// CancelAttemptV1 tells the agent to stop an attempt (§72). It is idempotent
// (§73): a repeated cancel is acknowledged again.
//
//	struct CancelAttemptV1 {
//	    attempt: [u8;16], lease: [u8;16],
//	    reason: CancellationReason,
//	    message: String,                    // ≤ MaxMessage (256) bytes, truncated on encode
//	}
//
// Validate: non-zero ids, known reason, UTF-8 message.
type CancelAttemptV1 struct {
	Attempt wire.JobAttemptId
	Lease   wire.LeaseId
	Reason  CancellationReason
	Message string
}

// Alike in shape to LeaseRejectedV1 and CompletionAckV1, but each carries its
// own enum: one layout (note.go), three types of the API.
const nameCancelAttempt = "agent.CancelAttemptV1"

// MessageType implements wire.Message.
func (*CancelAttemptV1) MessageType() wire.MessageTypeId { return MsgCancelAttempt }

// AppendPostcard implements wire.Message (the note layout, note.go).
func (m *CancelAttemptV1) AppendPostcard(b []byte) []byte {
	return appendNote(b, &m.Attempt.ULID, &m.Lease.ULID, uint32(m.Reason), m.Message)
}

// DecodePostcard implements wire.Message.
func (m *CancelAttemptV1) DecodePostcard(d *postcard.Decoder) {
	m.Reason = CancellationReason(decodeNote(d, &m.Attempt.ULID, &m.Lease.ULID, numCancellationReasons, &m.Message))
}

// Validate implements wire.Message.
func (m *CancelAttemptV1) Validate() error {
	return checkNote(nameCancelAttempt, idField{"attempt", m.Attempt.ULID}, idField{"lease", m.Lease.ULID},
		"reason", m.Reason.Valid(), m.Message)
}

// CancelAckV1 acknowledges a CancelAttemptV1 once the agent has begun
// stopping the attempt; the attempt's completion follows separately.
//
//	struct CancelAckV1 { attempt: [u8;16], lease: [u8;16] }
//
// Validate: non-zero ids.
type CancelAckV1 struct {
	Attempt wire.JobAttemptId
	Lease   wire.LeaseId
}

const nameCancelAck = "agent.CancelAckV1"

var maxCancelAckSize = 2 * maxsize.ID

// MessageType implements wire.Message.
func (*CancelAckV1) MessageType() wire.MessageTypeId { return MsgCancelAck }

// AppendPostcard implements wire.Message.
func (m *CancelAckV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Attempt.ULID[:]...)
	return append(b, m.Lease.ULID[:]...)
}

// DecodePostcard implements wire.Message.
func (m *CancelAckV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Attempt.ULID)
	wire.ReadULID(d, &m.Lease.ULID)
}

// Validate implements wire.Message.
func (m *CancelAckV1) Validate() error {
	return checkIDs(nameCancelAck, idField{"attempt", m.Attempt.ULID}, idField{"lease", m.Lease.ULID})
}

// PhaseChangeV1 reports that an attempt entered a new phase (§74).
//
//	struct PhaseChangeV1 { attempt: [u8;16], lease: [u8;16], phase: AttemptPhase, at_ms: u64 /* agent clock, Unix ms */ }
//
// Validate: non-zero ids and at_ms, known phase. AtMs comes from the
// agent's clock and is diagnostic only (§146).
type PhaseChangeV1 struct {
	Attempt wire.JobAttemptId
	Lease   wire.LeaseId
	Phase   AttemptPhase
	AtMs    uint64
}

const namePhaseChange = "agent.PhaseChangeV1"

// MessageType implements wire.Message.
func (*PhaseChangeV1) MessageType() wire.MessageTypeId { return MsgPhaseChange }

// AppendPostcard implements wire.Message. (ActiveAttemptV1 has the same
// layout but carries log_seq where this carries at_ms: one encoding, below,
// not one type.)
func (m *PhaseChangeV1) AppendPostcard(b []byte) []byte {
	return appendAttemptPhase(b, &m.Attempt, &m.Lease, m.Phase, m.AtMs)
}

// DecodePostcard implements wire.Message.
func (m *PhaseChangeV1) DecodePostcard(d *postcard.Decoder) {
	m.AtMs = decodeAttemptPhase(d, &m.Attempt, &m.Lease, &m.Phase)
}

// Validate implements wire.Message.
func (m *PhaseChangeV1) Validate() error {
	const n = namePhaseChange
	if err := checkIDs(n, idField{"attempt", m.Attempt.ULID}, idField{"lease", m.Lease.ULID}); err != nil {
		return err
	}
	if !m.Phase.Valid() {
		return invalid(n, "phase", "unknown phase")
	}
	if m.AtMs == 0 {
		return invalid(n, "at_ms", "zero")
	}
	return nil
}

// ActiveAttemptV1 and PhaseChangeV1 share one layout, {attempt: [u8;16],
// lease: [u8;16], phase: AttemptPhase, u64}, encoded and decoded by the two
// functions below. They stay two types: the u64 is log_seq in one and at_ms
// in the other.
const attemptPhaseMaxSize = 2*maxsize.ID + maxsize.Enum + maxsize.U64

func appendAttemptPhase(b []byte, attempt *wire.JobAttemptId, lease *wire.LeaseId, phase AttemptPhase, n uint64) []byte {
	b = append(b, attempt.ULID[:]...)
	b = append(b, lease.ULID[:]...)
	b = postcard.AppendVariant(b, uint32(phase))
	return postcard.AppendU64(b, n)
}

// decodeAttemptPhase reads the layout into attempt, lease and phase and
// returns the u64.
func decodeAttemptPhase(d *postcard.Decoder, attempt *wire.JobAttemptId, lease *wire.LeaseId, phase *AttemptPhase) uint64 {
	wire.ReadULID(d, &attempt.ULID)
	wire.ReadULID(d, &lease.ULID)
	*phase = AttemptPhase(d.Variant(numPhases))
	return d.U64()
}

// ExecutionResultKind is the discriminant of ExecutionResultV1.
type ExecutionResultKind uint32

// Execution results.
const (
	ResultSucceeded  ExecutionResultKind = 0 // carries ExitCode
	ResultFailed     ExecutionResultKind = 1 // carries ExitCode and Message
	ResultCancelled  ExecutionResultKind = 2
	ResultTimedOut   ExecutionResultKind = 3
	ResultInfraError ExecutionResultKind = 4 // carries Message: the runner, not the job, failed

	numExecutionResults = 5
)

// String returns the variant name, or "ExecutionResultKind(n)" for a value this build
// does not define.
func (k ExecutionResultKind) String() string {
	return enum.Name(executionResultKindNames[:], k, "ExecutionResultKind")
}

var executionResultKindNames = [...]string{
	ResultSucceeded: "Succeeded", ResultFailed: "Failed", ResultCancelled: "Cancelled",
	ResultTimedOut: "TimedOut", ResultInfraError: "InfraError",
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (k ExecutionResultKind) LogValue() slog.Value { return slog.StringValue(k.String()) }

// ExecutionResultV1 is an attempt's outcome (§75), a Postcard enum with data:
//
//	enum ExecutionResultV1 {
//	    Succeeded { exit_code: i32 } = 0,
//	    Failed { exit_code: i32, message: String /* ≤ 256, truncated on encode */ } = 1,
//	    Cancelled = 2,
//	    TimedOut = 3,
//	    InfraError { message: String /* ≤ 256, truncated on encode */ } = 4,
//	}
//
// Only the fields of Kind's variant are encoded; the others must be zero
// (Validate) and are zero after decoding.
type ExecutionResultV1 struct {
	Kind     ExecutionResultKind
	ExitCode int32
	Message  string
}

var maxExecutionResultSize = maxsize.Enum + maxsize.I32 + maxsize.Bytes(MaxMessage)

// AppendPostcard appends the result enum (discriminant, then the variant's
// fields). Hosts store results in this encoding (e.g. the authority).
func (r *ExecutionResultV1) AppendPostcard(b []byte) []byte {
	b = postcard.AppendVariant(b, uint32(r.Kind))
	switch r.Kind {
	case ResultSucceeded:
		b = postcard.AppendI32(b, r.ExitCode)
	case ResultFailed:
		b = postcard.AppendI32(b, r.ExitCode)
		b = postcard.AppendString(b, truncateText(r.Message, MaxMessage))
	case ResultInfraError:
		b = postcard.AppendString(b, truncateText(r.Message, MaxMessage))
	}
	return b
}

// DecodePostcard reads a result written by AppendPostcard.
func (r *ExecutionResultV1) DecodePostcard(d *postcard.Decoder) {
	*r = ExecutionResultV1{Kind: ExecutionResultKind(d.Variant(numExecutionResults))}
	switch r.Kind {
	case ResultSucceeded:
		r.ExitCode = d.I32()
	case ResultFailed:
		r.ExitCode = d.I32()
		r.Message = d.String(MaxMessage)
	case ResultInfraError:
		r.Message = d.String(MaxMessage)
	}
}

// Validate checks the result on its own (as the completion's result field).
func (r *ExecutionResultV1) Validate() error { return r.validate(nameAttemptCompletion) }

func (r *ExecutionResultV1) validate(msg string) error {
	const f = "result"
	switch r.Kind {
	case ResultSucceeded:
		if r.Message != "" {
			return invalid(msg, f, "field set that its variant does not carry")
		}
	case ResultFailed:
		return checkText(msg, f, r.Message)
	case ResultCancelled, ResultTimedOut:
		if r.ExitCode != 0 || r.Message != "" {
			return invalid(msg, f, "field set that its variant does not carry")
		}
	case ResultInfraError:
		if r.ExitCode != 0 {
			return invalid(msg, f, "field set that its variant does not carry")
		}
		return checkText(msg, f, r.Message)
	default:
		return invalid(msg, f, "unknown variant")
	}
	return nil
}

// AttemptCompletionV1 reports an attempt's final result and outputs (§75).
// The agent retries it with the same envelope MessageId until a
// CompletionAckV1 arrives, across reconnects (§77); the daemon deduplicates
// by MessageId (§78).
//
//	struct AttemptCompletionV1 {
//	    job: [u8;16], attempt: [u8;16], lease: [u8;16],
//	    spec: [u8;32],
//	    result: ExecutionResultV1,
//	    outputs: Vec<CasObjectRef>,         // ≤ MaxOutputs (1024)
//	    log_last_seq: u64,                  // last log sequence number written
//	}
//
// Validate: non-zero ids and spec, a valid result, outputs with known
// algorithms and non-zero digests.
type AttemptCompletionV1 struct {
	Job        wire.JobId
	Attempt    wire.JobAttemptId
	Lease      wire.LeaseId
	Spec       wire.JobSpecId
	Result     ExecutionResultV1
	Outputs    []wire.CasObjectRef
	LogLastSeq uint64
}

const nameAttemptCompletion = "agent.AttemptCompletionV1"

var maxAttemptCompletionSize = 3*maxsize.ID + maxsize.Digest + maxExecutionResultSize +
	maxsize.Seq(MaxOutputs, maxsize.Ref) + maxsize.U64

// MessageType implements wire.Message.
func (*AttemptCompletionV1) MessageType() wire.MessageTypeId { return MsgAttemptCompletion }

// AppendPostcard implements wire.Message.
func (m *AttemptCompletionV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Job.ULID[:]...)
	b = append(b, m.Attempt.ULID[:]...)
	b = append(b, m.Lease.ULID[:]...)
	b = append(b, m.Spec.Digest[:]...)
	b = m.Result.AppendPostcard(b)
	b = seq.Append(b, m.Outputs, (*wire.CasObjectRef).AppendPostcard)
	return postcard.AppendU64(b, m.LogLastSeq)
}

// DecodePostcard implements wire.Message. It reuses the capacity of
// m.Outputs.
func (m *AttemptCompletionV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Job.ULID)
	wire.ReadULID(d, &m.Attempt.ULID)
	wire.ReadULID(d, &m.Lease.ULID)
	wire.ReadDigest(d, &m.Spec.Digest)
	m.Result.DecodePostcard(d)
	for r := range seq.Decode(d, &m.Outputs, MaxOutputs, wire.CasObjectRefMinSize) {
		r.DecodePostcard(d)
	}
	m.LogLastSeq = d.U64()
}

// Validate implements wire.Message.
func (m *AttemptCompletionV1) Validate() error {
	const n = nameAttemptCompletion
	if err := checkIDs(n, idField{"job", m.Job.ULID}, idField{"attempt", m.Attempt.ULID},
		idField{"lease", m.Lease.ULID}); err != nil {
		return err
	}
	if m.Spec.IsZero() {
		return invalid(n, "spec", "zero digest")
	}
	if err := m.Result.validate(n); err != nil {
		return err
	}
	if len(m.Outputs) > MaxOutputs {
		return invalid(n, "outputs", "more elements than its bound")
	}
	for i := range m.Outputs {
		if err := checkCas(n, "outputs", &m.Outputs[i]); err != nil {
			return err
		}
	}
	return nil
}

// CompletionAckV1 is the daemon's verdict on a completion (§76). Any kind
// ends the agent's retries of that completion.
//
//	struct CompletionAckV1 {
//	    attempt: [u8;16], lease: [u8;16],
//	    kind: CompletionAckKind,
//	    message: String,                    // ≤ MaxMessage (256) bytes, truncated on encode
//	}
//
// Validate: non-zero ids, known kind, UTF-8 message.
type CompletionAckV1 struct {
	Attempt wire.JobAttemptId
	Lease   wire.LeaseId
	Kind    CompletionAckKind
	Message string
}

const nameCompletionAck = "agent.CompletionAckV1"

// MessageType implements wire.Message.
func (*CompletionAckV1) MessageType() wire.MessageTypeId { return MsgCompletionAck }

// AppendPostcard implements wire.Message (the note layout, note.go).
func (m *CompletionAckV1) AppendPostcard(b []byte) []byte {
	return appendNote(b, &m.Attempt.ULID, &m.Lease.ULID, uint32(m.Kind), m.Message)
}

// DecodePostcard implements wire.Message.
func (m *CompletionAckV1) DecodePostcard(d *postcard.Decoder) {
	m.Kind = CompletionAckKind(decodeNote(d, &m.Attempt.ULID, &m.Lease.ULID, numCompletionAckKinds, &m.Message))
}

// Validate implements wire.Message.
func (m *CompletionAckV1) Validate() error {
	return checkNote(nameCompletionAck, idField{"attempt", m.Attempt.ULID}, idField{"lease", m.Lease.ULID},
		"kind", m.Kind.Valid(), m.Message)
}
