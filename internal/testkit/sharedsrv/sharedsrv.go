// Package sharedsrv holds the one-server-per-test-binary pattern of the
// throwaway-server test kits (internal/testkit/pgtest, internal/testkit/s3test): started
// on first use, stopped from TestMain after m.Run.
package sharedsrv

import (
	"sync"
	"testing"
)

// Shared is a server of type *S that a test binary starts once.
type Shared[S any] struct {
	name  string
	start func() (*S, error)
	stop  func(*S)
	once  sync.Once
	srv   *S
	err   error
}

// New returns the shared server that start starts and stop stops; name
// prefixes the start error a test fails with ("pgtest").
func New[S any](name string, start func() (*S, error), stop func(*S)) *Shared[S] {
	return &Shared[S]{name: name, start: start, stop: stop}
}

// Get starts the server on first use and returns it; t fails when it
// could not be started.
func (sh *Shared[S]) Get(t testing.TB) *S {
	t.Helper()
	sh.once.Do(func() { sh.srv, sh.err = sh.start() })
	if sh.err != nil {
		t.Fatalf("%s: %v", sh.name, sh.err)
	}
	return sh.srv
}

// Stop stops the server Get started, if any.
func (sh *Shared[S]) Stop() {
	if sh.srv != nil {
		sh.stop(sh.srv)
	}
}
