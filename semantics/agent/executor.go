package agent

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"time"

	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// Job is one leased attempt handed to an Executor.
type Job struct {
	Lease   wire.LeaseId
	Attempt wire.JobAttemptId
	Job     wire.JobId
	Spec    wire.JobSpecId
	Payload wire.CasObjectRef
}

// Output lets an executor report progress. Methods are safe for concurrent
// use and never block for long.
type Output interface {
	// Phase reports a phase change (sent best effort and re-asserted in
	// heartbeats).
	Phase(p agentwire.AttemptPhase)
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
}

// NewSyntheticExecutor returns an executor for tests and demos whose
// duration, phases and exit code derive deterministically from the
// JobSpecId and seed. It has no field for a command and cannot run one
// (§98).
func NewSyntheticExecutor(seed uint64, opts SyntheticOptions) Executor {
	if opts.MinDuration <= 0 {
		opts.MinDuration = time.Millisecond
	}
	if opts.MaxDuration < opts.MinDuration {
		opts.MaxDuration = max(opts.MinDuration, 10*time.Millisecond)
	}
	return &synthetic{seed: seed, o: opts}
}

type synthetic struct {
	seed uint64
	o    SyntheticOptions
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
	return Result{Kind: agentwire.ResultSucceeded}
}
