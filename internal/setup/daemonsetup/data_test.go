package daemonsetup

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/testkit/s3test"
	"forgeyard.dev/transport/semantics/cas/castest"
	"forgeyard.dev/transport/semantics/objstore/s3store"
)

func TestMain(m *testing.M) {
	code := m.Run()
	s3test.StopShared()
	os.Exit(code)
}

// TestOpenDataS3: store = "s3" opens the shared bucket with the secret
// read from its file (never from the TOML); a missing or empty secret file
// or a missing bucket is an error naming the key.
func TestOpenDataS3(t *testing.T) {
	srv := s3test.Shared(t)
	bc := srv.NewBucket(t)
	secret := filepath.Join(t.TempDir(), "s3-secret")
	if err := os.WriteFile(secret, []byte(bc.SecretAccessKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := config.Data{Store: config.StoreS3, S3: config.S3{Endpoint: bc.Endpoint, Bucket: bc.Bucket, Region: bc.Region,
		Prefix: "site-a/", AccessKeyID: bc.AccessKeyID, SecretAccessKeyFile: secret, Insecure: true, PathStyle: true}}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	ds, err := OpenData(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	if ds.Sink == nil || ds.Store == nil || ds.Bucket == nil {
		t.Fatalf("stores %+v", ds)
	}
	ref := castest.Put(t, ds.Store, castest.Data(5000, 1))
	// The object is in the bucket under the prefix, as another daemon sees it.
	other, err := s3store.Open(context.Background(), bc)
	if err != nil {
		t.Fatal(err)
	}
	h := ref.Digest.String()
	if _, err := other.Stat(context.Background(), "site-a/cas/objects/sha256/"+h[:2]+"/"+h+"-5000"); err != nil {
		t.Fatalf("manifest not under the prefix: %v", err)
	}

	for _, c := range []struct {
		mod func(*config.Data)
		key string
	}{
		{func(d *config.Data) { d.S3.SecretAccessKeyFile = filepath.Join(t.TempDir(), "missing") }, "data.s3.secret_access_key_file"},
		{func(d *config.Data) {
			empty := filepath.Join(t.TempDir(), "empty")
			_ = os.WriteFile(empty, []byte("\n"), 0o600)
			d.S3.SecretAccessKeyFile = empty
		}, "data.s3.secret_access_key_file"},
		{func(d *config.Data) { d.S3.Bucket = "no-such-bucket" }, "data.s3"},
		{func(d *config.Data) { d.S3.AccessKeyID = "wrong" }, "data.s3"},
	} {
		bad := d
		c.mod(&bad)
		_, err := OpenData(context.Background(), bad)
		if err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("error %v, want one naming %s", err, c.key)
		}
		if err != nil && strings.Contains(err.Error(), bc.SecretAccessKey) {
			t.Errorf("the error shows the secret: %v", err)
		}
	}
}
