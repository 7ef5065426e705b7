package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"time"

	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

type attempt struct {
	job Job
	// trace is the span context of the attempt's lease.ack span: the
	// attempt.complete span continues it.
	trace    context.Context
	cancel   context.CancelFunc
	phase    agentwire.AttemptPhase
	finished bool
	// stopped: a cancel already stopped it (lease.go stopAttempt); later
	// copies of the cancel (§174) are not counted again. Under Agent.mu.
	stopped bool
	discard bool
	// expiry stops the attempt when its lease runs out unrenewed
	// (clock.go leaseUntil). Under Agent.mu.
	expiry  *time.Timer
	io      *attemptIO
	compl   *agentwire.AttemptCompletionV1
	complID wire.MessageId
	result  Result
	// secretsDone: Execute returned; its secrets were zeroed and later
	// deliveries are refused (secret.go). Under Agent.mu.
	secretsDone bool
}

type output struct {
	a  *Agent
	at *attempt
}

func (o output) Phase(p agentwire.AttemptPhase) {
	a := o.a
	a.mu.Lock()
	o.at.phase = p
	l := a.link
	a.mu.Unlock()
	if l != nil {
		_, _ = l.ch.SendMsg(&agentwire.PhaseChangeV1{Attempt: o.at.job.Attempt, Lease: o.at.job.Lease, Phase: p, AtMs: uint64(a.now().UnixMilli())})
	}
}

func (a *Agent) execute(ctx context.Context, at *attempt) {
	defer a.wg.Done()
	var res Result
	if src, err := a.fetchPayload(ctx, at); err != nil {
		res = Result{Kind: agentwire.ResultInfraError, Message: "payload download failed: " + err.Error()}
		if ctx.Err() != nil {
			res = Result{Kind: agentwire.ResultCancelled}
		}
	} else {
		job := at.job
		job.payload = src
		res = a.cfg.Executor.Execute(a.withSecrets(ctx, at), job, output{a: a, at: at})
	}
	a.dropSecrets(at)
	at.cancel()
	wr := agentwire.ExecutionResultV1{Kind: res.Kind}
	switch res.Kind {
	case agentwire.ResultSucceeded:
		wr.ExitCode = res.ExitCode
	case agentwire.ResultFailed:
		wr.ExitCode, wr.Message = res.ExitCode, res.Message
		if wr.Message == "" {
			wr.Message = "failed"
		}
	case agentwire.ResultInfraError:
		wr.Message = res.Message
		if wr.Message == "" {
			wr.Message = "infrastructure error"
		}
	case agentwire.ResultCancelled, agentwire.ResultTimedOut:
	default:
		wr = agentwire.ExecutionResultV1{Kind: agentwire.ResultInfraError, Message: "executor returned an unknown result kind"}
	}
	wr.Message = wire.TruncateUTF8(wr.Message, agentwire.MaxMessage)
	outs := slices.Clone(res.Outputs)
	if io := at.io; io != nil {
		io.mu.Lock()
		for _, r := range io.outs {
			if !slices.Contains(outs, r) {
				outs = append(outs, r)
			}
		}
		io.mu.Unlock()
	}
	if len(outs) > agentwire.MaxOutputs {
		outs = outs[:agentwire.MaxOutputs]
	}
	a.mu.Lock()
	discard := at.discard
	a.mu.Unlock()
	if !discard {
		outs = a.finishData(at, outs)
	} else if at.io != nil && at.io.w != nil {
		at.io.w.Close()
		_ = os.RemoveAll(filepath.Join(a.spool, "logs", at.job.Attempt.String()))
	}
	res.Outputs = outs
	a.mu.Lock()
	at.finished = true
	if at.expiry != nil {
		at.expiry.Stop()
	}
	if at.discard {
		delete(a.attempts, at.job.Attempt)
		a.mu.Unlock()
		return
	}
	at.result = res
	at.complID = wire.NewMessageId()
	at.compl = &agentwire.AttemptCompletionV1{Job: at.job.Job, Attempt: at.job.Attempt, Lease: at.job.Lease, Spec: at.job.Spec,
		Result: wr, Outputs: outs}
	a.mu.Unlock()
	a.complete(at)
}

// complete sends the completion with one MessageId until the daemon
// acknowledges it, across reconnects (§77, §122).
func (a *Agent) complete(at *attempt) {
	pctx := at.trace
	if pctx == nil {
		pctx = context.Background()
	}
	cctx, sp := a.cfg.Tracing.Start(pctx, telemetry.SpanComplete, telemetry.AttrLease(at.job.Lease), telemetry.AttrAttempt(at.job.Attempt))
	defer sp.End()
	retries, busy := 0, 0
	for {
		l, changed := a.currentLink()
		if l == nil {
			select {
			case <-changed:
				continue
			case <-a.ctx.Done():
				return
			}
		}
		if retries == 0 {
			a.st.complSent.Add(1)
		} else {
			a.st.complRetried.Add(1)
		}
		env, err := l.ch.Call(a.ctx, l.traceOut(cctx, control.Out{ID: at.complID, Msg: at.compl}), a.cfg.RequestTimeout)
		if err == nil {
			if ack, ok := env.Payload.(*agentwire.CompletionAckV1); ok {
				a.mu.Lock()
				delete(a.attempts, at.job.Attempt)
				a.mu.Unlock()
				if int(ack.Kind) < len(a.st.acks) {
					a.st.acks[ack.Kind].Add(1)
				}
				if h := a.cfg.Hooks.OnAttemptDone; h != nil {
					h(AttemptDone{Job: at.job, Result: at.result, Ack: ack.Kind, Retries: retries})
				}
				return
			}
		}
		retries++
		if a.ctx.Err() != nil {
			return
		}
		// Retry on the next transport, or after a short pause on this one
		// (fenced answers, timeouts). A daemon that cannot record it now
		// (its authority or data store is unavailable: WireErrorV1 with
		// RetryBackoff) is retried with a growing, jittered wait: the
		// completion is kept until acknowledged, never dropped.
		pause := min(a.cfg.RequestTimeout, 100*time.Millisecond)
		if we, ok := errors.AsType[*wire.WireErrorV1](err); ok && we.Retry == wire.RetryBackoff {
			pause += a.busyBackoff(busy)
			busy++
		} else {
			busy = 0
		}
		t := time.NewTimer(pause)
		select {
		case <-changed:
		case <-t.C:
		case <-a.ctx.Done():
		}
		t.Stop()
	}
}
