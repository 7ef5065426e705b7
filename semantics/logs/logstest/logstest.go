// Package logstest is the conformance suite of the durable log sinks:
// FileSink, and BucketSink over the filesystem objstore.Dir and over S3
// (internal/testkit/s3test), run the same tests.
package logstest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/wire"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// Sink is what the suite needs of a sink.
type Sink interface {
	logs.LogSink
	logs.Syncer
	logs.Forgetter
	logs.Collector
	ReadDurable(a wire.JobAttemptId, fn func(logs.Record) error) error
}

// Factory returns, per call, new empty storage and a function opening a
// sink on it (each call another process). shared says whether two sinks
// may be open on the storage at once (a shared bucket; FileSink is not).
type Factory func(t *testing.T) (open func() Sink, shared bool)

func app(t *testing.T, s Sink, a wire.JobAttemptId, from, to uint64, tag string) {
	t.Helper()
	for seq := from; seq <= to; seq++ {
		if err := s.Append(a, seq, wlogs.LogStdout, 1000+seq, fmt.Appendf(nil, "%s%d;", tag, seq)); err != nil {
			t.Fatalf("append %d: %v", seq, err)
		}
	}
}

func sync(t *testing.T, s Sink, a wire.JobAttemptId) {
	t.Helper()
	if err := s.Sync(a); err != nil {
		t.Fatalf("sync: %v", err)
	}
}

// content reads the durable log and checks order and uniqueness.
func content(t *testing.T, s Sink, a wire.JobAttemptId) string {
	t.Helper()
	var b strings.Builder
	var last uint64
	if err := s.ReadDurable(a, func(r logs.Record) error {
		if r.Seq != last+1 {
			t.Fatalf("record seq %d after %d", r.Seq, last)
		}
		if r.TimestampMs != 1000+r.Seq || r.Kind != wlogs.LogStdout {
			t.Fatalf("record %+v", r)
		}
		last = r.Seq
		b.Write(r.Data)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func want(parts ...string) string { return strings.Join(parts, "") }

func seqs(tag string, from, to uint64) string {
	var b strings.Builder
	for i := from; i <= to; i++ {
		fmt.Fprintf(&b, "%s%d;", tag, i)
	}
	return b.String()
}

// Run runs the suite.
func Run(t *testing.T, newSink Factory) {
	t.Run("RestartForgetsUnsynced", func(t *testing.T) {
		open, _ := newSink(t)
		s := open()
		a := wire.NewJobAttemptId()
		if d := s.Durable(a); d != 0 {
			t.Fatalf("new attempt durable %d", d)
		}
		app(t, s, a, 1, 5, "a")
		sync(t, s, a)
		if d := s.Durable(a); d != 5 {
			t.Fatalf("durable %d after sync", d)
		}
		app(t, s, a, 6, 7, "lost")
		if err := s.Append(a, 9, wlogs.LogStdout, 0, nil); err == nil {
			t.Fatal("out-of-order append accepted")
		}
		_ = s.Forget(a) // a restart: 6 and 7 were never synced
		s = open()
		if d := s.Durable(a); d != 5 {
			t.Fatalf("durable %d after restart, want 5", d)
		}
		app(t, s, a, 6, 8, "b")
		sync(t, s, a)
		if got := content(t, s, a); got != want(seqs("a", 1, 5), seqs("b", 6, 8)) {
			t.Fatalf("content %q", got)
		}
	})
	t.Run("Handoff", func(t *testing.T) {
		// The agent moves: the next sink continues from the durable
		// sequence the first left, and either reads the whole log.
		open, shared := newSink(t)
		s1 := open()
		a := wire.NewJobAttemptId()
		app(t, s1, a, 1, 3, "x")
		sync(t, s1, a)
		app(t, s1, a, 4, 6, "x")
		sync(t, s1, a)
		if !shared {
			_ = s1.Forget(a)
		}
		s2 := open()
		if d := s2.Durable(a); d != 6 {
			t.Fatalf("durable on the other sink %d, want 6", d)
		}
		app(t, s2, a, 7, 9, "y")
		sync(t, s2, a)
		w := want(seqs("x", 1, 6), seqs("y", 7, 9))
		if got := content(t, s2, a); got != w {
			t.Fatalf("content %q", got)
		}
		if shared {
			if got := content(t, s1, a); got != w {
				t.Fatalf("content on the first sink %q", got)
			}
		}
	})
	t.Run("LateSyncOfTheOldHolder", func(t *testing.T) {
		open, shared := newSink(t)
		if !shared {
			t.Skip("the sink's storage is not shared between processes (capability)")
		}
		s1, s2 := open(), open()
		a := wire.NewJobAttemptId()
		app(t, s1, a, 1, 5, "x")
		sync(t, s1, a)
		app(t, s1, a, 6, 7, "x") // in flight when the agent moved
		if d := s2.Durable(a); d != 5 {
			t.Fatalf("durable %d", d)
		}
		app(t, s2, a, 6, 8, "x")
		sync(t, s2, a)
		sync(t, s1, a) // the old daemon's late sync: 6-7 again
		if got := content(t, s2, a); got != seqs("x", 1, 8) {
			t.Fatalf("content %q", got)
		}
	})
	t.Run("LogsDelete", func(t *testing.T) {
		open, _ := newSink(t)
		s := open()
		a, b := wire.NewJobAttemptId(), wire.NewJobAttemptId()
		app(t, s, a, 1, 3, "a")
		sync(t, s, a)
		app(t, s, b, 1, 2, "b")
		sync(t, s, b)
		got := map[wire.JobAttemptId]logs.AttemptLog{}
		if err := s.Logs(func(l logs.AttemptLog) error { got[l.Attempt] = l; return nil }); err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[a].Bytes <= got[b].Bytes || got[b].Bytes == 0 ||
			time.Since(got[a].Modified) > time.Hour {
			t.Fatalf("Logs = %+v", got)
		}
		if err := s.DeleteLog(a); err != nil {
			t.Fatal(err)
		}
		if d := s.Durable(a); d != 0 {
			t.Fatalf("durable %d after DeleteLog", d)
		}
		if got := content(t, s, a); got != "" {
			t.Fatalf("content after DeleteLog %q", got)
		}
		if got := content(t, s, b); got != seqs("b", 1, 2) {
			t.Fatalf("the other log: %q", got)
		}
	})
}
