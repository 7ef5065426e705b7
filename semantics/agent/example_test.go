package agent_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"time"

	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

type phases []agentwire.AttemptPhase

func (p *phases) Phase(ph agentwire.AttemptPhase) { *p = append(*p, ph) }
func (p *phases) Log(wlogs.LogStreamKind, []byte) error {
	return nil
}
func (p *phases) PutOutput(data []byte) (wire.CasObjectRef, error) {
	return wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: sha256.Sum256(data), Size: uint64(len(data))}, nil
}

// ExampleNewSyntheticExecutor: the outcome derives from the JobSpecId, so
// the same spec always behaves the same.
func ExampleNewSyntheticExecutor() {
	exec := agent.NewSyntheticExecutor(42, agent.SyntheticOptions{MaxDuration: 2 * time.Millisecond})
	var seen phases
	res := exec.Execute(context.Background(), agent.Job{Spec: wire.JobSpecId{Digest: wire.Digest{1}}}, &seen)
	fmt.Println(res.Kind, seen)
	// Output: Succeeded [Preparing Running UploadingOutputs]
}
