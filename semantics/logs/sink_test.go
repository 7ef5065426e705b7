package logs_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/wire"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// A FileSink restarted after unsynced appends forgets them: Durable is the
// synced point and the next append continues from it.
func TestFileSinkRestart(t *testing.T) {
	dir := t.TempDir()
	a := wire.NewJobAttemptId()
	s, err := logs.NewFileSink(dir, logs.FileSinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	app := func(s *logs.FileSink, seq uint64, data string) {
		t.Helper()
		if err := s.Append(a, seq, wlogs.LogStderr, 1000+seq, []byte(data)); err != nil {
			t.Fatalf("append %d: %v", seq, err)
		}
	}
	for seq := uint64(1); seq <= 5; seq++ {
		app(s, seq, "durable ")
	}
	if err := s.Sync(a); err != nil {
		t.Fatal(err)
	}
	app(s, 6, "lost ")
	app(s, 7, "lost ")
	if err := s.Append(a, 9, wlogs.LogStdout, 0, nil); err == nil {
		t.Fatal("out-of-order append accepted")
	}
	if err := s.Close(); err != nil { // a restart: 6 and 7 were never synced
		t.Fatal(err)
	}

	s, err = logs.NewFileSink(dir, logs.FileSinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if d := s.Durable(a); d != 5 {
		t.Fatalf("durable %d after restart, want 5", d)
	}
	app(s, 6, "again")
	if err := s.Sync(a); err != nil {
		t.Fatal(err)
	}
	var got string
	var seqs []uint64
	if err := s.ReadDurable(a, func(r logs.Record) error {
		if r.Kind != wlogs.LogStderr || r.TimestampMs != 1000+r.Seq {
			t.Errorf("record %+v", r)
		}
		got += string(r.Data)
		seqs = append(seqs, r.Seq)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got != "durable durable durable durable durable again" || len(seqs) != 6 || seqs[5] != 6 {
		t.Fatalf("content %q seqs %v", got, seqs)
	}

	// A damaged index is reported, not trusted.
	if err := s.Forget(a); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, a.String()+".idx"), []byte("garbage-garbage-garb"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(a, 7, wlogs.LogStdout, 0, []byte("x")); !errors.Is(err, logs.ErrCorruptSink) {
		t.Fatalf("append with a corrupt index: %v", err)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count open files: %v", err)
	}
	return len(es)
}

// Receiver.Forget forgets the attempt in a Forgetter sink too: the
// FileSink closes the attempt's file (nothing is retained per finished
// attempt), and a later use of the attempt continues from what is durable.
func TestReceiverForgetClosesSinkFile(t *testing.T) {
	s, err := logs.NewFileSink(t.TempDir(), logs.FileSinkOptions{NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r, err := logs.NewReceiver(logs.ReceiverConfig{Sink: s})
	if err != nil {
		t.Fatal(err)
	}
	a := wire.NewJobAttemptId()
	fds := openFDs(t)
	if err := s.Append(a, 1, wlogs.LogStdout, 1, []byte("one\n")); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(a); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(a, 2, wlogs.LogStdout, 2, []byte("unsynced\n")); err != nil {
		t.Fatal(err)
	}
	if n := openFDs(t); n != fds+1 {
		t.Fatalf("open files %d → %d after the first append, want one more", fds, n)
	}
	r.Forget(a)
	if n := openFDs(t); n != fds {
		t.Fatalf("open files %d after Forget, want %d: the sink kept the attempt's file", n, fds)
	}
	// As after a restart: the unsynced append is gone, the log continues
	// from the durable point.
	if d := s.Durable(a); d != 1 {
		t.Fatalf("Durable after Forget = %d, want 1", d)
	}
	if err := s.Append(a, 2, wlogs.LogStdout, 3, []byte("two\n")); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(a); err != nil {
		t.Fatal(err)
	}
	recs := fileRecords(t, s, a)
	if len(recs) != 2 || string(recs[0].Data) != "one\n" || string(recs[1].Data) != "two\n" {
		t.Fatalf("records after Forget and resume: %+v", recs)
	}
}

// countingForgetter is a MemorySink that counts Forget calls.
type countingForgetter struct {
	logs.MemorySink
	forgot []wire.JobAttemptId
}

func (c *countingForgetter) Forget(a wire.JobAttemptId) error {
	c.forgot = append(c.forgot, a)
	return nil
}

// Receiver.Forget calls a Forgetter sink's Forget for the attempt, also
// when the Receiver itself no longer tracks it.
func TestReceiverForgetCallsForgetter(t *testing.T) {
	s := &countingForgetter{}
	r, err := logs.NewReceiver(logs.ReceiverConfig{Sink: s})
	if err != nil {
		t.Fatal(err)
	}
	a := wire.NewJobAttemptId()
	r.Forget(a)
	if len(s.forgot) != 1 || s.forgot[0] != a {
		t.Fatalf("sink forgot %v, want [%s]", s.forgot, a)
	}
}
