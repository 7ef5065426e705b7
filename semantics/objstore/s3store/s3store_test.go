package s3store_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"forgeyard.dev/transport/internal/testkit/s3test"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/cas/castest"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/semantics/logs/logstest"
	"forgeyard.dev/transport/semantics/objstore"
	"forgeyard.dev/transport/semantics/objstore/objstoretest"
	"forgeyard.dev/transport/semantics/objstore/s3store"
)

func TestMain(m *testing.M) {
	code := m.Run()
	s3test.StopShared()
	os.Exit(code)
}

// TestS3Conformance runs the Bucket suite against a real S3 server
// (versitygw, internal/testkit/s3test).
func TestS3Conformance(t *testing.T) {
	srv := s3test.Shared(t)
	objstoretest.Run(t, func(t *testing.T) objstore.Bucket { return srv.Open(t) })
}

// TestS3CASConformance runs the ContentStore suite on a BucketStore over
// S3: what another daemon on the same bucket sees is tested there too.
func TestS3CASConformance(t *testing.T) {
	srv := s3test.Shared(t)
	castest.Run(t, func(t *testing.T) func() castest.Store {
		cfg := srv.NewBucket(t)
		return func() castest.Store {
			b, err := s3store.Open(context.Background(), cfg)
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

// TestS3LogConformance runs the log sink suite on a BucketSink over S3.
func TestS3LogConformance(t *testing.T) {
	srv := s3test.Shared(t)
	logstest.Run(t, func(t *testing.T) (func() logstest.Sink, bool) {
		cfg := srv.NewBucket(t)
		return func() logstest.Sink {
			b, err := s3store.Open(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			s, err := logs.NewBucketSink(logs.BucketSinkConfig{Bucket: b, Prefix: "logs/"})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}, true
	})
}

// TestS3Probe (issue 27 item 4): objstore.Probe (a Stat of a key never
// written) succeeds against a running S3 server and fails, as
// ErrUnavailable, once the server is gone.
func TestS3Probe(t *testing.T) {
	srv, err := s3test.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	b := srv.Open(t)
	ctx := context.Background()
	if err := objstore.Probe(ctx, b); err != nil {
		t.Fatalf("probe of a running server: %v", err)
	}
	srv.Stop()
	if err := objstore.Probe(ctx, b); !errors.Is(err, objstore.ErrUnavailable) {
		t.Fatalf("probe of a stopped server: %v, want ErrUnavailable", err)
	}
}
