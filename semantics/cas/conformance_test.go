package cas_test

import (
	"testing"

	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/cas/castest"
	"forgeyard.dev/transport/semantics/objstore"
)

func TestFSStoreConformance(t *testing.T) {
	castest.Run(t, func(t *testing.T) func() castest.Store {
		dir := t.TempDir()
		return func() castest.Store {
			s, err := cas.NewFSStore(cas.FSStoreConfig{Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	})
}

// TestBucketStoreConformance: BucketStore over the filesystem Bucket, with
// small chunks so that objects span several.
func TestBucketStoreConformance(t *testing.T) {
	castest.Run(t, func(t *testing.T) func() castest.Store {
		dir := t.TempDir()
		return func() castest.Store {
			b, err := objstore.NewDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			s, err := cas.NewBucketStore(cas.BucketStoreConfig{Bucket: b, Prefix: "cas/", ChunkSize: 4096})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	})
}
