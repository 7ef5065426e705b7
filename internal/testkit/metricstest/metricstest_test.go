package metricstest

import (
	"os"
	"path/filepath"
	"testing"
)

// TestPromtoolCheckAccepts: a well-formed exposition passes the real
// promtool. (A rejected one fails the test by design; the rejection path
// is exercised by recording fake TB below.)
func TestPromtoolCheckAccepts(t *testing.T) {
	PromtoolCheck(t, "# HELP forgeyard_x_total A counter.\n# TYPE forgeyard_x_total counter\nforgeyard_x_total 1\n")
}

type recTB struct {
	testing.TB
	failed bool
}

func (r *recTB) Helper()               {}
func (r *recTB) Fatalf(string, ...any) { r.failed = true; panic(r) }
func (r *recTB) Fatal(...any)          { r.failed = true; panic(r) }

// TestPromtoolCheckRejects: a counter without the _total suffix and
// without HELP is a promtool lint finding, so the check fails.
func TestPromtoolCheckRejects(t *testing.T) {
	r := &recTB{TB: t}
	func() {
		defer func() {
			if v := recover(); v != nil && v != any(r) {
				panic(v)
			}
		}()
		PromtoolCheck(r, "# TYPE forgeyard_x counter\nforgeyard_x 1\n")
	}()
	if !r.failed {
		t.Fatal("promtool accepted a counter without _total and HELP")
	}
}

// TestWriteSample: with FORGEYARD_SAMPLES_DIR set the body lands in the
// named file.
func TestWriteSample(t *testing.T) {
	d := t.TempDir()
	t.Setenv("FORGEYARD_SAMPLES_DIR", d)
	WriteSample(t, "x.txt", "body")
	b, err := os.ReadFile(filepath.Join(d, "x.txt"))
	if err != nil || string(b) != "body" {
		t.Fatalf("sample = %q, %v", b, err)
	}
}
