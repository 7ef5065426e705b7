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
