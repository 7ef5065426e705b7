package agent

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// Job is one leased attempt handed to an Executor.
type Job struct {
	Lease   wire.LeaseId
	Attempt wire.JobAttemptId
	Job     wire.JobId
	Spec    wire.JobSpecId
	Payload wire.CasObjectRef

	payload cas.Source // the agent's store, once the payload is in it
}

// ErrNoPayload is returned by Job.OpenPayload when the agent did not fetch
// the payload (Config.FetchPayload is off, or the lease has none).
var ErrNoPayload = errors.New("agent: payload not fetched for this attempt")

// OpenPayload opens the attempt's payload, downloaded and verified before
// the executor started (Config.FetchPayload). The caller closes it.
func (j Job) OpenPayload() (io.ReadCloser, error) {
	if j.payload == nil {
		return nil, ErrNoPayload
	}
	return j.payload.Open(j.Payload, 0)
}

// Output lets an executor report progress. Methods are safe for concurrent
// use and never block for long.
type Output interface {
	// Phase reports a phase change (sent best effort and re-asserted in
	// heartbeats).
	Phase(p agentwire.AttemptPhase)
	// Log appends p to the attempt's log (kind stdout, stderr or system).
	// It does not wait for the network: the log is sent in order on the
	// attempt's log stream, resumed after reconnects, and is durable at the
	// daemon before the completion is sent. Data over the spool cap is
	// dropped and counted (logs.ErrDropped); ErrNoLog if the attempt has
	// no log.
	Log(kind wlogs.LogStreamKind, p []byte) error
	// PutOutput stores data as an output of the attempt and returns its
	// reference (SHA-256). Outputs are uploaded to the daemon before the
	// completion is sent and added to the completion's outputs; an output
	// that cannot be uploaded is left out of them.
	PutOutput(data []byte) (wire.CasObjectRef, error)
}

// Result is an attempt's outcome.
type Result struct {
	Kind     agentwire.ExecutionResultKind
	ExitCode int32  // Succeeded, Failed
	Message  string // Failed, InfraError (≤ 256 bytes, truncated)
	Outputs  []wire.CasObjectRef
}

// Executor runs leased attempts. Execute is called once per accepted lease
// on its own goroutine; ctx is cancelled when the daemon cancels the
// attempt, when a resync says Stale/Cancel, when a renewal reports the
// lease revoked, and when the agent closes. An executor should return
// promptly after ctx ends, with Kind ResultCancelled.
type Executor interface {
	Execute(ctx context.Context, job Job, out Output) Result
}

// ExecutorFunc adapts a function to Executor.
type ExecutorFunc func(ctx context.Context, job Job, out Output) Result

// Execute calls f.
func (f ExecutorFunc) Execute(ctx context.Context, job Job, out Output) Result {
	return f(ctx, job, out)
}

// SyntheticOptions shape the synthetic executor. Zero values are defaults.
type SyntheticOptions struct {
	// MinDuration and MaxDuration bound the run time (default 1 ms – 10 ms).
	MinDuration, MaxDuration time.Duration
	// FailPercent is the share of specs (0–100) that fail with exit code 1.
	FailPercent int
	// LogLines is the number of stdout lines written (SyntheticLogLine);
	// 0 means DefaultSyntheticLogLines, negative none.
	LogLines int
	// LogInterval is a pause after each log line (the Running phase then
	// lasts at least LogLines×LogInterval); 0 writes them all at once.
	LogInterval time.Duration
	// OutputSize is the size of the one output (SyntheticOutput) stored
	// before a successful return; 0 means DefaultSyntheticOutputSize,
	// negative none.
	OutputSize int
}

// Synthetic executor defaults.
const (
	DefaultSyntheticLogLines   = 4
	DefaultSyntheticOutputSize = 256
)

// SyntheticLogLine is the i-th (from 0) log line the synthetic executor
// writes for spec.
func SyntheticLogLine(spec wire.JobSpecId, i int) string {
	return fmt.Sprintf("synthetic %x line %d\n", spec.Digest[:6], i)
}

// SyntheticOutput is the output blob of size bytes the synthetic executor
// stores for spec: SHA-256 in counter mode over the spec, so it is
// deterministic and distinct per spec.
func SyntheticOutput(spec wire.JobSpecId, size int) []byte {
	out := make([]byte, 0, size+sha256.Size)
	var b [40]byte
	copy(b[:32], spec.Digest[:])
	for i := uint64(0); len(out) < size; i++ {
		binary.LittleEndian.PutUint64(b[32:], i)
		h := sha256.Sum256(b[:])
		out = append(out, h[:]...)
	}
	return out[:size]
}

// NewSyntheticExecutor returns an executor for tests and demos whose
// duration, phases and exit code derive deterministically from the
// JobSpecId and seed. It has no field for a command and cannot run one
// (§98).
func NewSyntheticExecutor(seed uint64, opts SyntheticOptions) Executor {
	if opts.MinDuration <= 0 {
		opts.MinDuration = time.Millisecond
	}
	opts.LogLines = cmp.Or(opts.LogLines, DefaultSyntheticLogLines)
	opts.OutputSize = cmp.Or(opts.OutputSize, DefaultSyntheticOutputSize)
	if opts.MaxDuration < opts.MinDuration {
		opts.MaxDuration = max(opts.MinDuration, 10*time.Millisecond)
	}
	return &synthetic{seed: seed, o: opts}
}

type synthetic struct {
	seed uint64
	o    SyntheticOptions
}

// readPayload reads a fetched payload to its end and describes it in one
// log line (size and SHA-256 of what was read); ok is false when the
// attempt has no fetched payload.
func readPayload(job Job) (string, bool) {
	rc, err := job.OpenPayload()
	if errors.Is(err, ErrNoPayload) {
		return "", false
	}
	if err != nil {
		return fmt.Sprintf("payload %s: %v\n", job.Payload, err), true
	}
	defer rc.Close()
	h := sha256.New()
	n, err := io.Copy(h, rc)
	if err != nil {
		return fmt.Sprintf("payload %s: read: %v\n", job.Payload, err), true
	}
	return fmt.Sprintf("payload read: %d bytes, sha256 %x\n", n, h.Sum(nil)), true
}

// Plan returns what the synthetic executor does for spec: its duration and
// exit code.
func (s *synthetic) plan(spec wire.JobSpecId) (time.Duration, int32) {
	var b [40]byte
	copy(b[:32], spec.Digest[:])
	binary.LittleEndian.PutUint64(b[32:], s.seed)
	h := sha256.Sum256(b[:])
	x := binary.LittleEndian.Uint64(h[:8])
	span := uint64(s.o.MaxDuration-s.o.MinDuration) + 1
	d := s.o.MinDuration + time.Duration(x%span)
	code := int32(0)
	if int(h[8])%100 < s.o.FailPercent {
		code = 1
	}
	return d, code
}

func (s *synthetic) Execute(ctx context.Context, job Job, out Output) Result {
	d, code := s.plan(job.Spec)
	phases := []agentwire.AttemptPhase{agentwire.PhasePreparing, agentwire.PhaseRunning, agentwire.PhaseUploadingOutputs}
	step := d / time.Duration(len(phases))
	t := time.NewTimer(step)
	defer t.Stop()
	for i, p := range phases {
		out.Phase(p)
		if p == agentwire.PhasePreparing {
			if line, ok := readPayload(job); ok {
				_ = out.Log(wlogs.LogSystem, []byte(line))
			}
		}
		if p == agentwire.PhaseRunning {
			for j := 0; j < s.o.LogLines; j++ {
				_ = out.Log(wlogs.LogStdout, []byte(SyntheticLogLine(job.Spec, j)))
				if s.o.LogInterval > 0 {
					if !sleepCtx(ctx, s.o.LogInterval) {
						return Result{Kind: agentwire.ResultCancelled}
					}
				}
			}
		}
		if i > 0 {
			t.Reset(step)
		}
		select {
		case <-ctx.Done():
			return Result{Kind: agentwire.ResultCancelled}
		case <-t.C:
		}
	}
	if code != 0 {
		return Result{Kind: agentwire.ResultFailed, ExitCode: code, Message: "synthetic failure"}
	}
	if s.o.OutputSize > 0 {
		if _, err := out.PutOutput(SyntheticOutput(job.Spec, s.o.OutputSize)); err != nil {
			return Result{Kind: agentwire.ResultInfraError, Message: "storing the output: " + err.Error()}
		}
	}
	return Result{Kind: agentwire.ResultSucceeded}
}

// sleepCtx waits d or until ctx ends; it reports whether d elapsed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
