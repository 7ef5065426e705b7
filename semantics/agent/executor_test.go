package agent

import (
	"context"
	"testing"
	"time"

	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// cancelAfter cancels when the n-th log line is written.
type cancelAfter struct {
	recOut
	n      int
	cancel context.CancelFunc
}

func (c *cancelAfter) Log(kind wlogs.LogStreamKind, p []byte) error {
	_ = c.recOut.Log(kind, p)
	if len(c.log) == c.n {
		c.cancel()
	}
	return nil
}

func TestSyntheticExecutorLogInterval(t *testing.T) {
	const lines, every = 5, 20 * time.Millisecond
	e := NewSyntheticExecutor(1, SyntheticOptions{LogLines: lines, LogInterval: every})
	spec := wire.JobSpecId{Digest: wire.Digest{9}}
	var o recOut
	start := time.Now()
	r := e.Execute(context.Background(), Job{Spec: spec}, &o)
	if took := time.Since(start); took < lines*every {
		t.Fatalf("%d lines %v apart took %v", lines, every, took)
	}
	if r.Kind != agentwire.ResultSucceeded || len(o.log) != lines || o.log[lines-1] != wlogs.LogStdout.String()+":"+SyntheticLogLine(spec, lines-1) {
		t.Fatalf("result %v, log %q", r.Kind, o.log)
	}

	// Cancelled between two lines: it stops writing and reports Cancelled.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &cancelAfter{n: 2, cancel: cancel}
	if r := e.Execute(ctx, Job{Spec: spec}, c); r.Kind != agentwire.ResultCancelled || len(c.log) != 2 {
		t.Fatalf("cancelled after 2 lines: result %v, %d lines", r.Kind, len(c.log))
	}
}
