// Package probe holds the write probes that semantics/logs' sinks and
// semantics/cas' stores answer Probe with (a daemon probes a sink or store
// that failed, to notice its recovery): one for a directory, one for an
// objstore.Bucket. It is semantics' own, so that the two data paths share
// one copy without importing each other.
package probe

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"time"

	"forgeyard.dev/transport/semantics/objstore"
)

// Size is the write a probe tests: one filesystem block or more.
const Size = 4096

// Dir tests that dir takes a small synced file: it writes Size bytes to a
// new temporary file there, fsyncs and closes it, and removes it.
func Dir(dir string) error {
	f, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return err
	}
	name := f.Name()
	defer os.Remove(name)
	_, err = f.Write(make([]byte, Size))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Bucket tests that b takes a small object: it puts Size bytes at
// prefix+"probe/<Unix nanoseconds>" and deletes them.
func Bucket(ctx context.Context, b objstore.Bucket, prefix string) error {
	key := prefix + "probe/" + strconv.FormatInt(time.Now().UnixNano(), 10)
	if err := b.Put(ctx, key, bytes.NewReader(make([]byte, Size)), Size); err != nil {
		return err
	}
	return b.Delete(ctx, key)
}
