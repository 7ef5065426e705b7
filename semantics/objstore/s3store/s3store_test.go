package s3store_test

import (
	"os"
	"testing"

	"forgeyard.dev/transport/internal/s3test"
	"forgeyard.dev/transport/semantics/objstore"
	"forgeyard.dev/transport/semantics/objstore/objstoretest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	s3test.StopShared()
	os.Exit(code)
}

// TestS3Conformance runs the Bucket suite against a real S3 server
// (versitygw, internal/s3test).
func TestS3Conformance(t *testing.T) {
	srv := s3test.Shared(t)
	objstoretest.Run(t, func(t *testing.T) objstore.Bucket { return srv.Open(t) })
}
