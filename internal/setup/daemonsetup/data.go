package daemonsetup

import (
	"context"
	"fmt"
	"strings"

	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/semantics/objstore"
	"forgeyard.dev/transport/semantics/objstore/s3store"
)

// maxSecretFile bounds data.s3.secret_access_key_file.
const maxSecretFile = 4 << 10

// DataStores are the daemon's log sink and content store built from
// [data]: with store = "local" (the default) a FileSink in log_dir and an
// FSStore in cas_dir, each nil when its directory is not set; with
// store = "s3" a BucketSink and a BucketStore in the shared bucket of
// [data.s3] (under <prefix>logs/ and <prefix>cas/), which every HA daemon
// configured alike sees.
type DataStores struct {
	Sink  logs.LogSink
	Store cas.ContentStore
	// Bucket is the shared bucket (nil for local stores).
	Bucket objstore.Bucket
}

// OpenData opens the stores of d (validated). Errors name the key.
func OpenData(ctx context.Context, d config.Data) (DataStores, error) {
	var ds DataStores
	if d.Store != config.StoreS3 {
		if d.LogDir != "" {
			s, err := logs.NewFileSink(d.LogDir, logs.FileSinkOptions{})
			if err != nil {
				return ds, fmt.Errorf("data.log_dir: %w", err)
			}
			ds.Sink = s
		}
		if d.CASDir != "" {
			s, err := cas.NewFSStore(cas.FSStoreConfig{Dir: d.CASDir})
			if err != nil {
				return ds, fmt.Errorf("data.cas_dir: %w", err)
			}
			ds.Store = s
		}
		return ds, nil
	}
	c := d.S3
	secret, err := readSmallFile(c.SecretAccessKeyFile, maxSecretFile)
	if err != nil {
		return ds, fmt.Errorf("data.s3.secret_access_key_file: %w", err)
	}
	secret = strings.TrimSpace(secret)
	if secret == "" {
		return ds, fmt.Errorf("data.s3.secret_access_key_file %q: empty", c.SecretAccessKeyFile)
	}
	b, err := s3store.Open(ctx, s3store.Config{Endpoint: c.Endpoint, Bucket: c.Bucket, Region: c.Region, Prefix: c.Prefix,
		AccessKeyID: c.AccessKeyID, SecretAccessKey: secret, Insecure: c.Insecure, CAFile: c.CAFile, PathStyle: c.PathStyle,
		Timeout: c.Timeout.Duration})
	if err != nil {
		return ds, fmt.Errorf("data.s3 (endpoint %s, bucket %s): %w", c.Endpoint, c.Bucket, err)
	}
	ds.Bucket = b
	if ds.Sink, err = logs.NewBucketSink(logs.BucketSinkConfig{Bucket: b, Prefix: "logs/"}); err != nil {
		return ds, fmt.Errorf("data.s3: %w", err)
	}
	if ds.Store, err = cas.NewBucketStore(cas.BucketStoreConfig{Bucket: b, Prefix: "cas/"}); err != nil {
		return ds, fmt.Errorf("data.s3: %w", err)
	}
	return ds, nil
}
