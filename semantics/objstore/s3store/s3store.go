// Package s3store is the objstore.Bucket of an S3-compatible object store
// (AWS S3, MinIO, Ceph RGW, versitygw, SeaweedFS), through minio-go. It is
// the only package that links an S3 SDK (internal/testkit/deptest): the
// daemon's data plane sees only objstore.Bucket.
//
// Every object lives under Config.Prefix in Config.Bucket. PUT is atomic
// in S3 (an object is visible whole or not at all, also for multipart
// uploads), which is all the CAS and log layouts above need.
package s3store

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"forgeyard.dev/transport/semantics/objstore"
)

// DefaultTimeout bounds one S3 request when Config.Timeout is 0.
const DefaultTimeout = 30 * time.Second

// Config configures a Store. Endpoint, Bucket and the credentials are
// required.
type Config struct {
	// Endpoint is host:port of the S3 API (no scheme).
	Endpoint string
	// Bucket must exist (Open checks it) unless CreateBucket is set.
	Bucket string
	// Region of the bucket ("" lets the client discover it; "us-east-1"
	// for most self-hosted servers).
	Region string
	// Prefix is prepended to every key ("" for none; a trailing "/" is
	// added when missing).
	Prefix string
	// AccessKeyID and SecretAccessKey are the static credentials.
	AccessKeyID, SecretAccessKey string
	// Insecure talks plain HTTP instead of HTTPS (loopback tests only).
	Insecure bool
	// CAFile, when set, is a PEM file of the CAs that verify the server
	// (instead of the system pool).
	CAFile string
	// PathStyle addresses the bucket as endpoint/bucket instead of
	// bucket.endpoint (most self-hosted servers need it).
	PathStyle bool
	// Timeout bounds one request; 0 means DefaultTimeout.
	Timeout time.Duration
	// CreateBucket creates the bucket when it is missing (tests).
	CreateBucket bool
}

// Store is an objstore.Bucket over S3. Safe for concurrent use.
type Store struct {
	c       *minio.Client
	bucket  string
	prefix  string
	timeout time.Duration
}

var _ objstore.Bucket = (*Store)(nil)

// Open connects and checks (or creates) the bucket.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	switch {
	case cfg.Endpoint == "":
		return nil, errors.New("s3store: endpoint is required")
	case strings.Contains(cfg.Endpoint, "://"):
		return nil, fmt.Errorf("s3store: endpoint %q: give host:port without a scheme (insecure selects http)", cfg.Endpoint)
	case cfg.Bucket == "":
		return nil, errors.New("s3store: bucket is required")
	case cfg.AccessKeyID == "" || cfg.SecretAccessKey == "":
		return nil, errors.New("s3store: access key id and secret access key are required")
	}
	tr, err := minio.DefaultTransport(!cfg.Insecure)
	if err != nil {
		return nil, err
	}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("s3store: ca file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("s3store: ca file %q: no PEM certificate", cfg.CAFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	lookup := minio.BucketLookupAuto
	if cfg.PathStyle {
		lookup = minio.BucketLookupPath
	}
	c, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:        credentials.NewStaticV4(cfg.AccessKeyID, cfg.SecretAccessKey, ""),
		Secure:       !cfg.Insecure,
		Transport:    http.RoundTripper(tr),
		Region:       cfg.Region,
		BucketLookup: lookup,
	})
	if err != nil {
		return nil, fmt.Errorf("s3store: %w", err)
	}
	s := &Store{c: c, bucket: cfg.Bucket, prefix: cfg.Prefix, timeout: cfg.Timeout}
	if s.prefix != "" && !strings.HasSuffix(s.prefix, "/") {
		s.prefix += "/"
	}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	ok, err := c.BucketExists(cctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("s3store: bucket %q at %s: %w", cfg.Bucket, cfg.Endpoint, err)
	}
	if !ok {
		if !cfg.CreateBucket {
			return nil, fmt.Errorf("s3store: bucket %q does not exist at %s", cfg.Bucket, cfg.Endpoint)
		}
		if err := c.MakeBucket(cctx, cfg.Bucket, minio.MakeBucketOptions{Region: cfg.Region}); err != nil {
			return nil, fmt.Errorf("s3store: create bucket %q: %w", cfg.Bucket, err)
		}
	}
	return s, nil
}

// ctx bounds one request by the store's timeout.
func (s *Store) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

// translate maps S3 error codes to objstore's sentinels, keeping the
// original wrapped (the one place this package translates errors).
func translate(key string, err error) error {
	if err == nil {
		return nil
	}
	r := minio.ToErrorResponse(err)
	switch r.Code {
	case "NoSuchKey", "NotFound":
		return fmt.Errorf("%w: %s", objstore.ErrNotExist, key)
	case "XMinioStorageFull", "StorageFull", "InsufficientStorage", "QuotaExceeded", "XAmzQuotaExceeded":
		return fmt.Errorf("%w: %s: %w", objstore.ErrNoSpace, key, err)
	}
	if r.StatusCode == http.StatusNotFound && r.Code == "" {
		return fmt.Errorf("%w: %s", objstore.ErrNotExist, key)
	}
	if r.StatusCode == http.StatusInsufficientStorage {
		return fmt.Errorf("%w: %s: %w", objstore.ErrNoSpace, key, err)
	}
	return fmt.Errorf("%w: s3store: %s: %w", objstore.ErrUnavailable, key, err)
}

// Put implements objstore.Bucket.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := objstore.CheckKey(key); err != nil {
		return err
	}
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	_, err := s.c.PutObject(cctx, s.bucket, s.prefix+key, io.LimitReader(r, size), size,
		minio.PutObjectOptions{ContentType: "application/octet-stream"})
	return translate(key, err)
}

// Get implements objstore.Bucket. The request is bounded by the store's
// timeout from the first read on; the reader must be closed.
func (s *Store) Get(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	if err := objstore.CheckKey(key); err != nil {
		return nil, err
	}
	if length == 0 {
		if _, err := s.Stat(ctx, key); err != nil {
			return nil, err
		}
		return io.NopCloser(strings.NewReader("")), nil
	}
	var opts minio.GetObjectOptions
	switch {
	case length > 0:
		if err := opts.SetRange(off, off+length-1); err != nil {
			return nil, err
		}
	case off > 0:
		if err := opts.SetRange(off, 0); err != nil {
			return nil, err
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	o, err := s.c.GetObject(cctx, s.bucket, s.prefix+key, opts)
	if err != nil {
		cancel()
		return nil, translate(key, err)
	}
	// GetObject is lazy: Stat sends the request, so a missing object
	// fails here rather than on the first Read.
	if _, err := o.Stat(); err != nil {
		o.Close()
		cancel()
		return nil, translate(key, err)
	}
	return &object{o: o, key: key, cancel: cancel}, nil
}

type object struct {
	o      *minio.Object
	key    string
	cancel context.CancelFunc
}

func (o *object) Read(p []byte) (int, error) {
	n, err := o.o.Read(p)
	if err != nil && err != io.EOF {
		err = translate(o.key, err)
	}
	return n, err
}

func (o *object) Close() error {
	err := o.o.Close()
	o.cancel()
	return err
}

// Stat implements objstore.Bucket.
func (s *Store) Stat(ctx context.Context, key string) (objstore.Info, error) {
	if err := objstore.CheckKey(key); err != nil {
		return objstore.Info{}, err
	}
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	oi, err := s.c.StatObject(cctx, s.bucket, s.prefix+key, minio.StatObjectOptions{})
	if err != nil {
		return objstore.Info{}, translate(key, err)
	}
	return objstore.Info{Key: key, Size: oi.Size, Modified: oi.LastModified}, nil
}

// List implements objstore.Bucket (S3 lists in lexical key order).
func (s *Store) List(ctx context.Context, prefix string, fn func(objstore.Info) error) error {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for oi := range s.c.ListObjects(cctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + prefix, Recursive: true}) {
		if oi.Err != nil {
			return translate(prefix, oi.Err)
		}
		key := strings.TrimPrefix(oi.Key, s.prefix)
		if strings.HasSuffix(key, "/") {
			continue // a directory marker some servers report
		}
		if err := fn(objstore.Info{Key: key, Size: oi.Size, Modified: oi.LastModified}); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// Delete implements objstore.Bucket.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := objstore.CheckKey(key); err != nil {
		return err
	}
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	err := translate(key, s.c.RemoveObject(cctx, s.bucket, s.prefix+key, minio.RemoveObjectOptions{}))
	if errors.Is(err, objstore.ErrNotExist) {
		return nil
	}
	return err
}
