package objstore_test

import (
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
