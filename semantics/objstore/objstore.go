// Package objstore is the object store contract under the daemon's shared
// data plane: a flat namespace of immutable objects, each written whole
// (Put is atomic: a reader sees all of it or nothing), read by range,
// listed by prefix and deleted. Dir is the filesystem implementation;
// semantics/objstore/s3store implements it over the S3 API. Nothing here
// imports an SDK, so semantics/cas (BucketStore) and semantics/logs
// (BucketSink) build on it without linking one.
//
// Several daemons may share one Bucket (HA, docs/operations.md "Shared
// data plane"): the CAS and log layouts on top of it only ever create
// objects under names derived from their content (digest, offset, log
// sequence numbers), so two writers of the same name write the same bytes.
package objstore

import (
	"context"
	"errors"
	"fmt"
	"forgeyard.dev/transport/semantics/internal/atomicfile"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// Info describes a stored object.
type Info struct {
	Key      string
	Size     int64
	Modified time.Time
}

// Bucket is an object store. Keys are slash-separated paths of the
// characters [A-Za-z0-9._-/] without empty, "." or ".." elements.
// Implementations are safe for concurrent use.
type Bucket interface {
	// Put stores size bytes from r under key, replacing any object there;
	// the object becomes visible only complete.
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	// Get returns the object's bytes from off, length bytes (or to its end
	// when length < 0). It fails with ErrNotExist when there is no object.
	Get(ctx context.Context, key string, off, length int64) (io.ReadCloser, error)
	// Stat describes one object, or fails with ErrNotExist.
	Stat(ctx context.Context, key string) (Info, error)
	// List calls fn for every object whose key starts with prefix, in
	// lexical key order; an error from fn ends the listing and is returned.
	List(ctx context.Context, prefix string, fn func(Info) error) error
	// Delete removes the object; deleting a missing object succeeds.
	Delete(ctx context.Context, key string) error
}

// ErrNotExist: there is no object under the key. It wraps fs.ErrNotExist.
var ErrNotExist = fmt.Errorf("objstore: %w", fs.ErrNotExist)

// ErrNoSpace: the store refused a write for lack of space (ENOSPC, EDQUOT,
// or the server's equivalent). Callers report it as a retryable,
// operator-visible condition (docs/operations.md "Disk full").
var ErrNoSpace = errors.New("objstore: no space left in the object store")

// ErrUnavailable: the object store failed a request for another reason
// (unreachable, server error). Bucket implementations over a network wrap
// their errors with it.
var ErrUnavailable = errors.New("objstore: object store unavailable")

// IsNoSpace reports whether err is a lack of space: ErrNoSpace, ENOSPC or
// EDQUOT anywhere in its chain.
func IsNoSpace(err error) bool {
	return errors.Is(err, ErrNoSpace) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// CheckKey reports an invalid key.
func CheckKey(key string) error {
	if key == "" || strings.HasPrefix(key, "/") || strings.HasSuffix(key, "/") {
		return fmt.Errorf("objstore: invalid key %q", key)
	}
	for _, el := range strings.Split(key, "/") {
		if el == "" || el == "." || el == ".." {
			return fmt.Errorf("objstore: invalid key %q", key)
		}
		for _, c := range el {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
				return fmt.Errorf("objstore: invalid key %q", key)
			}
		}
	}
	return nil
}

// Dir is the filesystem Bucket: object key k is the file Root/k, written
// to a temporary file beside it, fsynced, renamed into place and the
// directory fsynced. Files are created readable by their owner only.
type Dir struct {
	Root string
	// NoFsync skips the fsyncs (tests and benchmarks).
	NoFsync bool
}

var _ Bucket = (*Dir)(nil)

// NewDir returns the Bucket of the directory root, creating it if needed.
func NewDir(root string) (*Dir, error) {
	if root == "" {
		return nil, errors.New("objstore: directory is required")
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	return &Dir{Root: root}, nil
}

func (d *Dir) path(key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	return filepath.Join(d.Root, filepath.FromSlash(key)), nil
}

// tmpSuffix marks Put's temporary files; List skips them.
const tmpSuffix = ".objstore-tmp"

// Put implements Bucket.
func (d *Dir) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, filepath.Base(p)+".*"+tmpSuffix)
	if err != nil {
		return err
	}
	tmp := f.Name()
	n, err := io.Copy(f, io.LimitReader(r, size))
	if err == nil && n != size {
		err = fmt.Errorf("objstore: put %s: %d of %d bytes", key, n, size)
	}
	if err == nil && !d.NoFsync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if d.NoFsync {
			err = os.Rename(tmp, p)
		} else {
			err = atomicfile.Rename(tmp, p) // and fsyncs the directory
		}
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// Get implements Bucket.
func (d *Dir) Get(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	p, err := d.path(key)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotExist
	}
	if err != nil {
		return nil, err
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	if length < 0 {
		return f, nil
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(f, length), f}, nil
}

// Stat implements Bucket.
func (d *Dir) Stat(ctx context.Context, key string) (Info, error) {
	p, err := d.path(key)
	if err != nil {
		return Info{}, err
	}
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) || err == nil && !fi.Mode().IsRegular() {
		return Info{}, ErrNotExist
	}
	if err != nil {
		return Info{}, err
	}
	return Info{Key: key, Size: fi.Size(), Modified: fi.ModTime()}, nil
}

// List implements Bucket.
func (d *Dir) List(ctx context.Context, prefix string, fn func(Info) error) error {
	// Walk the deepest directory the prefix names entirely, then filter.
	base := ""
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		base = prefix[:i]
	}
	root := d.Root
	if base != "" {
		if err := CheckKey(base); err != nil {
			return err
		}
		root = filepath.Join(d.Root, filepath.FromSlash(base))
	}
	var infos []Info
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if e.IsDir() || strings.HasSuffix(p, tmpSuffix) {
			return nil
		}
		rel, err := filepath.Rel(d.Root, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if !strings.HasPrefix(key, prefix) {
			return nil
		}
		fi, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		infos = append(infos, Info{Key: key, Size: fi.Size(), Modified: fi.ModTime()})
		return nil
	})
	if err != nil {
		return err
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].Key < infos[j].Key })
	for _, in := range infos {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(in); err != nil {
			return err
		}
	}
	return nil
}

// Delete implements Bucket; empty parent directories are left in place.
func (d *Dir) Delete(ctx context.Context, key string) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// ProbeKey is the key Probe looks up: no object is ever stored under it,
// so the answer is a cheap "not found" from a store that is reachable.
const ProbeKey = "forgeyard-probe"

// Prober is implemented by a Bucket with a cheaper or more telling
// reachability check than Probe's Stat (Dir: its root directory).
type Prober interface {
	Probe(ctx context.Context) error
}

// Probe checks that b answers: b's own Probe when it has one, else a Stat
// of ProbeKey, for which "not found" is the healthy answer. It reads
// nothing and writes nothing.
func Probe(ctx context.Context, b Bucket) error {
	if p, ok := b.(Prober); ok {
		return p.Probe(ctx)
	}
	if _, err := b.Stat(ctx, ProbeKey); err != nil && !errors.Is(err, ErrNotExist) {
		return err
	}
	return nil
}

// Probe implements Prober: the root directory exists and is a directory.
func (d *Dir) Probe(ctx context.Context) error {
	fi, err := os.Stat(d.Root)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("objstore: %s is not a directory", d.Root)
	}
	return nil
}
