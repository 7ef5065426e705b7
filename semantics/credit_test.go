package semantics_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/semantics"
)

// TestCreditBelowMaxStreamsWarns: a backend whose stream credit is below
// Limits.MaxStreams (it was not given the same Limits) makes NewConn log
// one warning naming both numbers; a backend given the Limits does not.
func TestCreditBelowMaxStreamsWarns(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	lim := semantics.Limits{MaxStreams: 1777}

	a, b := memory.Pipe(memory.Options{Limits: lim})
	defer a.CloseWithCode(0, "")
	defer b.CloseWithCode(0, "")
	if _, err := semantics.NewConn(a, semantics.Config{Limits: lim, Logger: log}); err != nil {
		t.Fatal(err)
	}
	if buf.Len() != 0 {
		t.Fatalf("a backend given the Limits warned: %s", buf.String())
	}

	for range 2 {
		a, b := memory.Pipe(memory.Options{}) // credit 1000
		defer a.CloseWithCode(0, "")
		defer b.CloseWithCode(0, "")
		if _, err := semantics.NewConn(a, semantics.Config{Limits: lim, Logger: log}); err != nil {
			t.Fatal(err)
		}
	}
	out := buf.String()
	if strings.Count(out, "level=WARN") != 1 || !strings.Contains(out, "credit=1000") || !strings.Contains(out, "max_streams=1777") {
		t.Fatalf("want one warning naming credit=1000 and max_streams=1777, got:\n%s", out)
	}
}
