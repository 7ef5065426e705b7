// Package s3test starts a throwaway S3-compatible server for tests:
// versitygw (Apache-2.0) with its POSIX backend in a fresh temporary
// directory, listening on a free loopback port, with generated root
// credentials. The binary is built once with `go install
// github.com/versity/versitygw/cmd/versitygw@<Version>` into the user cache
// directory (GOBIN=$XDG_CACHE_HOME/forgeyard/s3test/<Version>) and reused by
// every later run; `make deps` (.ci/ensure-versitygw.sh) builds it ahead.
// When FORGEYARD_VERSITYGW is set it names the binary to use instead.
//
// It is never a mock: tests talk the S3 API over HTTP to a real server.
// Without Go module proxy access on first use Start fails with an
// actionable message; tests never skip silently.
package s3test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/sharedsrv"
	"forgeyard.dev/transport/semantics/objstore/s3store"
)

// Version is the versitygw release the tests build.
const Version = "v1.8.0"

// Server is a running versitygw.
type Server struct {
	Endpoint          string // host:port (plain HTTP)
	AccessKeyID       string
	SecretAccessKey   string
	Region            string
	dir               string
	cmd               *exec.Cmd
	done              chan struct{}
	bucketSeq         atomic.Int64
	stopOnce          sync.Once
	logPath, dataPath string
}

var shared = sharedsrv.New("s3test", Start, (*Server).Stop)

// Shared starts one server per test binary on first use. Call StopShared
// from TestMain after m.Run.
func Shared(t testing.TB) *Server {
	t.Helper()
	return shared.Get(t)
}

// StopShared stops the server started by Shared, if any.
func StopShared() { shared.Stop() }

var buildMu sync.Mutex

// Binary returns the path of the versitygw binary, building it into the
// user cache directory on first use.
func Binary() (string, error) {
	if p := os.Getenv("FORGEYARD_VERSITYGW"); p != "" {
		return p, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("user cache dir: %w", err)
	}
	bin := filepath.Join(cache, "forgeyard", "s3test", Version)
	path := filepath.Join(bin, "versitygw")
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() {
		return path, nil
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", err
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", errors.New("the go command is not in PATH; it is needed once to build versitygw (or set FORGEYARD_VERSITYGW)")
	}
	// A lock file keeps parallel test binaries from building it twice.
	lock := filepath.Join(bin, ".building")
	for i := 0; ; i++ {
		f, err := os.OpenFile(lock, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err == nil {
			f.Close()
			break
		}
		if fi, serr := os.Stat(path); serr == nil && fi.Mode().IsRegular() {
			return path, nil
		}
		if fi, serr := os.Stat(lock); serr == nil && time.Since(fi.ModTime()) > 15*time.Minute {
			_ = os.Remove(lock) // a build that died
			continue
		}
		if i > 15*60*2 {
			return "", fmt.Errorf("waited 15 minutes for another build of versitygw (%s)", lock)
		}
		time.Sleep(500 * time.Millisecond) // polling another process's build; not test synchronisation
	}
	defer os.Remove(lock)
	cmd := exec.Command(gobin, "install", "github.com/versity/versitygw/cmd/versitygw@"+Version)
	// Build outside the module (no go.mod influence) with the cache dir as GOBIN.
	cmd.Dir = bin
	cmd.Env = append(os.Environ(), "GOBIN="+bin, "GOFLAGS=-buildvcs=false", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install versitygw@%s: %v\n%s", Version, err, out)
	}
	return path, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Start builds (if needed) and starts a new server.
func Start() (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "forgeyard-s3-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, AccessKeyID: "fy" + randHex(8), SecretAccessKey: randHex(20), Region: "us-east-1",
		dataPath: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "versitygw.log")}
	if err := os.MkdirAll(s.dataPath, 0o700); err != nil {
		s.cleanup()
		return nil, err
	}
	for attempt := 0; attempt < 3; attempt++ {
		if err = s.start(bin); err == nil {
			return s, nil
		}
	}
	s.cleanup()
	return nil, err
}

func (s *Server) start(bin string) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s.Endpoint = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	// The sidecar directory holds object metadata, so the data directory
	// needs no extended attributes (a tmpfs /tmp may lack user xattrs).
	side := filepath.Join(s.dir, "meta")
	if err := os.MkdirAll(side, 0o700); err != nil {
		logf.Close()
		return err
	}
	cmd := exec.Command(bin, "--port", s.Endpoint, "--access", s.AccessKeyID, "--secret", s.SecretAccessKey,
		"--region", s.Region, "--quiet", "posix", "--sidecar", side, s.dataPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start versitygw: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Endpoint, time.Second)
		if err == nil {
			c.Close()
			s.cmd, s.done = cmd, done
			return nil
		}
		select {
		case <-done:
			b, _ := os.ReadFile(s.logPath)
			return fmt.Errorf("versitygw exited at start:\n%s", b)
		case <-time.After(50 * time.Millisecond): // polling an external process's listener
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-done
			return errors.New("versitygw did not listen within 30 s")
		}
	}
}

// Config returns an s3store.Config for bucket on this server.
func (s *Server) Config(bucket string) s3store.Config {
	return s3store.Config{Endpoint: s.Endpoint, Bucket: bucket, Region: s.Region, AccessKeyID: s.AccessKeyID,
		SecretAccessKey: s.SecretAccessKey, Insecure: true, PathStyle: true}
}

// NewBucket creates a fresh bucket for one test and returns its
// configuration. The bucket's directory is removed when the test ends.
func (s *Server) NewBucket(t testing.TB) s3store.Config {
	t.Helper()
	name := fmt.Sprintf("fy-%d-%d", os.Getpid(), s.bucketSeq.Add(1))
	cfg := s.Config(name)
	cfg.CreateBucket = true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s3store.Open(ctx, cfg); err != nil {
		t.Fatalf("s3test: create bucket: %v", err)
	}
	cfg.CreateBucket = false
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Join(s.dataPath, name)) })
	return cfg
}

// Open returns a Store of a fresh bucket (NewBucket).
func (s *Server) Open(t testing.TB) *s3store.Store {
	t.Helper()
	st, err := s3store.Open(context.Background(), s.NewBucket(t))
	if err != nil {
		t.Fatalf("s3test: %v", err)
	}
	return st
}

// Stop stops the server and removes its directory.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		if s.cmd != nil {
			_ = s.cmd.Process.Kill()
			<-s.done
		}
		s.cleanup()
	})
}

func (s *Server) cleanup() { _ = os.RemoveAll(s.dir) }
