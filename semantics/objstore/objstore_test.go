package objstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"forgeyard.dev/transport/semantics/objstore"
	"forgeyard.dev/transport/semantics/objstore/objstoretest"
)

func TestDirConformance(t *testing.T) {
	objstoretest.Run(t, func(t *testing.T) objstore.Bucket {
		d, err := objstore.NewDir(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return d
	})
}

// statOnly is a Bucket without a Prober of its own: Probe uses Stat.
type statOnly struct {
	objstore.Bucket
	err error
}

func (s statOnly) Stat(ctx context.Context, key string) (objstore.Info, error) {
	if s.err != nil {
		return objstore.Info{}, s.err
	}
	return s.Bucket.Stat(ctx, key)
}

// TestProbe (issue 27 item 4): a Dir is reachable while its root exists
// and not once it is gone; a bucket without a Prober is reachable when the
// Stat of ProbeKey answers "not found", and not when Stat fails otherwise.
func TestProbe(t *testing.T) {
	root := filepath.Join(t.TempDir(), "b")
	d, err := objstore.NewDir(root)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := objstore.Probe(ctx, d); err != nil {
		t.Fatalf("Dir probe: %v", err)
	}
	if err := objstore.Probe(ctx, statOnly{Bucket: d}); err != nil {
		t.Fatalf("Stat probe of a missing key: %v", err)
	}
	down := fmt.Errorf("%w: connection refused", objstore.ErrUnavailable)
	if err := objstore.Probe(ctx, statOnly{Bucket: d, err: down}); !errors.Is(err, objstore.ErrUnavailable) {
		t.Fatalf("Stat probe of an unavailable store: %v", err)
	}
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	if err := objstore.Probe(ctx, d); err == nil {
		t.Fatal("Dir probe succeeded with its root removed")
	}
}
