package agent_test

import (
	"context"
	"crypto/sha256"
	"fmt"

	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// printOutput is a stand-in for the agent's agent.Output, which sends
// phases, logs and outputs to the daemon; here they are printed.
type printOutput struct{}

func (printOutput) Phase(p agentwire.AttemptPhase) { fmt.Println("phase", p) }
func (printOutput) Log(kind wlogs.LogStreamKind, p []byte) error {
	fmt.Printf("log %v: %s", kind, p)
	return nil
}
func (printOutput) PutOutput(data []byte) (wire.CasObjectRef, error) {
	return wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: sha256.Sum256(data), Size: uint64(len(data))}, nil
}

// ExampleExecutorFunc writes an executor as a function: it reports its
// phase, writes its log (sent in order, resumed after reconnects, durable
// at the daemon before the completion), stores an output, and honours
// cancellation by returning ResultCancelled once ctx ends. The agent calls
// Execute once per accepted lease, on its own goroutine (Config.Executor;
// docs/embedding.md).
func ExampleExecutorFunc() {
	exec := agent.ExecutorFunc(func(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
		out.Phase(agentwire.PhaseRunning)
		_ = out.Log(wlogs.LogStdout, []byte("make all\n"))
		if ctx.Err() != nil {
			return agent.Result{Kind: agentwire.ResultCancelled}
		}
		ref, err := out.PutOutput([]byte("artifact"))
		if err != nil {
			return agent.Result{Kind: agentwire.ResultInfraError, Message: "output not stored"}
		}
		return agent.Result{Kind: agentwire.ResultSucceeded, Outputs: []wire.CasObjectRef{ref}}
	})

	r := exec.Execute(context.Background(), agent.Job{Attempt: wire.NewJobAttemptId()}, printOutput{})
	fmt.Println("result", r.Kind, "outputs", len(r.Outputs))

	cancelled, cancel := context.WithCancel(context.Background())
	cancel() // what the agent does when the daemon cancels the attempt
	fmt.Println("cancelled:", exec.Execute(cancelled, agent.Job{}, printOutput{}).Kind)
	// Output:
	// phase Running
	// log Stdout: make all
	// result Succeeded outputs 1
	// phase Running
	// log Stdout: make all
	// cancelled: Cancelled
}
