package cas

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"forgeyard.dev/transport/semantics/internal/atomicfile"
	"forgeyard.dev/transport/semantics/internal/probe"
	"forgeyard.dev/transport/wire"
)

// Status is what a ContentStore holds of one object.
type Status struct {
	// Complete: the object is stored and was verified when committed.
	Complete bool
	// Partial is the length of a stored partial prefix (bytes), 0 when
	// there is none or the object is complete.
	Partial uint64
}

// Source reads stored objects. Open returns the object's bytes from offset
// to its end; it fails with ErrNotFound when the object is not complete.
// The caller closes the reader. ContentStore implements Source.
type Source interface {
	Open(ref wire.CasObjectRef, offset uint64) (io.ReadCloser, error)
}

// ContentStore stores objects by reference. Implementations are safe for
// concurrent use. An object becomes visible to Stat and Open only after a
// PartialObject's Commit; partial prefixes survive Close for a later
// resume.
type ContentStore interface {
	Source
	// Stat reports whether ref is stored, or how long a partial prefix is.
	Stat(ref wire.CasObjectRef) (Status, error)
	// Create returns the partial object of ref, creating it empty or
	// reopening a prefix left by an interrupted transfer (Len reports its
	// length). Errors: ErrExists (already complete), ErrBusy (another
	// transfer holds it), ErrTooLarge, ErrTooManyPartials,
	// ErrUnsupportedAlgorithm, or an I/O error.
	Create(ref wire.CasObjectRef) (PartialObject, error)
}

// PartialObject is an object being received. It is used by one goroutine.
// Exactly one of Commit, Abort or Close ends it; later calls fail with
// ErrClosed (Close after an end is a no-op).
type PartialObject interface {
	// ReaderAt reads the stored prefix (for re-hashing on resume).
	io.ReaderAt
	// Len is the length of the stored prefix in bytes.
	Len() uint64
	// Append adds p to the prefix. Appending beyond the object's size fails
	// with ErrTooLarge and appends nothing.
	Append(p []byte) error
	// Commit makes the object visible. The caller has verified the digest
	// of the complete content; Commit only checks that Len equals the
	// object's size, publishes atomically and releases the partial.
	Commit() error
	// Abort discards the prefix.
	Abort() error
	// Close keeps the prefix for a later Create and releases it.
	Close() error
}

// newHash returns the hash of alg, or ErrUnsupportedAlgorithm.
func newHash(alg wire.DigestAlgorithm) (hash.Hash, error) {
	if err := checkAlgorithm(alg); err != nil {
		return nil, err
	}
	return sha256.New(), nil
}

// checkAlgorithm returns ErrUnsupportedAlgorithm, naming alg, unless this
// build implements alg (SHA-256 only).
func checkAlgorithm(alg wire.DigestAlgorithm) error {
	if alg != wire.DigestSHA256 {
		return fmt.Errorf("%w: %s", ErrUnsupportedAlgorithm, alg)
	}
	return nil
}

// FSStore defaults.
const (
	DefaultMaxObjectSize = 64 << 30
	DefaultMaxPartials   = 256
)

// FSStore is the filesystem ContentStore: complete objects at
// Dir/objects/<alg>/<hh>/<hex> (content-addressed, read-only after an
// atomic rename), partial prefixes at Dir/tmp/<alg>-<hex>-<size>.part.
// Create it with NewFSStore. Safe for concurrent use.
type FSStore struct {
	dir, objDir, tmpDir string
	maxSize             uint64
	maxPartials         int

	mu   sync.Mutex
	busy map[wire.CasObjectRef]struct{} // partials currently held
}

// FSStoreConfig configures an FSStore. Zero fields take defaults.
type FSStoreConfig struct {
	// Dir is the store's root; it is created if missing. Required.
	Dir string
	// MaxObjectSize bounds one object (bytes); 0 means DefaultMaxObjectSize.
	MaxObjectSize uint64
	// MaxPartials bounds partial objects held open at once; 0 means
	// DefaultMaxPartials.
	MaxPartials int
}

// NewFSStore opens (creating if needed) a store in cfg.Dir.
func NewFSStore(cfg FSStoreConfig) (*FSStore, error) {
	if cfg.Dir == "" {
		return nil, errors.New("cas: FSStoreConfig.Dir is required")
	}
	if cfg.MaxPartials < 0 {
		return nil, errors.New("cas: FSStoreConfig.MaxPartials is negative")
	}
	s := &FSStore{
		dir:         cfg.Dir,
		objDir:      filepath.Join(cfg.Dir, "objects"),
		tmpDir:      filepath.Join(cfg.Dir, "tmp"),
		maxSize:     cfg.MaxObjectSize,
		maxPartials: cfg.MaxPartials,
		busy:        map[wire.CasObjectRef]struct{}{},
	}
	orDefault(&s.maxSize, DefaultMaxObjectSize)
	orDefault(&s.maxPartials, DefaultMaxPartials)
	for _, d := range []string{s.objDir, s.tmpDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// MaxObjectSize returns the store's object size bound in bytes.
func (s *FSStore) MaxObjectSize() uint64 { return s.maxSize }

func algName(a wire.DigestAlgorithm) string {
	if a == wire.DigestSHA256 {
		return "sha256"
	}
	return "blake3"
}

func (s *FSStore) objPath(ref wire.CasObjectRef) string {
	h := ref.Digest.String()
	return filepath.Join(s.objDir, algName(ref.Algorithm), h[:2], h)
}

func (s *FSStore) partPath(ref wire.CasObjectRef) string {
	return filepath.Join(s.tmpDir, fmt.Sprintf("%s-%s-%d.part", algName(ref.Algorithm), ref.Digest, ref.Size))
}

// complete reports whether a committed file of the right size exists.
func (s *FSStore) complete(ref wire.CasObjectRef) (bool, error) {
	fi, err := os.Stat(s.objPath(ref))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return fi.Mode().IsRegular() && uint64(fi.Size()) == ref.Size, nil
}

// Stat implements ContentStore.
func (s *FSStore) Stat(ref wire.CasObjectRef) (Status, error) {
	if ok, err := s.complete(ref); ok || err != nil {
		return Status{Complete: ok}, err
	}
	fi, err := os.Stat(s.partPath(ref))
	if errors.Is(err, fs.ErrNotExist) {
		return Status{}, nil
	}
	if err != nil {
		return Status{}, err
	}
	n := uint64(fi.Size())
	if n > ref.Size {
		n = 0 // a corrupt partial; Create truncates it
	}
	return Status{Partial: n}, nil
}

// Open implements Source: the object's bytes from offset to its end.
func (s *FSStore) Open(ref wire.CasObjectRef, offset uint64) (io.ReadCloser, error) {
	if offset > ref.Size {
		return nil, fmt.Errorf("cas: open %s at %d: offset beyond size", ref, offset)
	}
	f, err := os.Open(s.objPath(ref))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil || uint64(fi.Size()) != ref.Size {
		f.Close()
		return nil, ErrNotFound
	}
	if _, err := f.Seek(int64(offset), io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Create implements ContentStore.
func (s *FSStore) Create(ref wire.CasObjectRef) (PartialObject, error) {
	return createHeld[*fsPartial](s, ref)
}

func (s *FSStore) holds() (*sync.Mutex, map[wire.CasObjectRef]struct{}, uint64, int) {
	return &s.mu, s.busy, s.maxSize, s.maxPartials
}

// heldStore is what createHeld needs of a store (FSStore, BucketStore):
// its partial-holding state (the mutex guarding busy, busy, the object
// size limit and the partials limit) and its create and release.
type heldStore[P PartialObject] interface {
	holds() (mu *sync.Mutex, busy map[wire.CasObjectRef]struct{}, maxSize uint64, maxPartials int)
	create(wire.CasObjectRef) (P, error)
	release(wire.CasObjectRef)
}

// createHeld is the Create of both stores: ref is checked against the
// store's limits and held (ErrBusy for a second Create of it) while create
// runs; a failed create releases it.
func createHeld[P PartialObject](s heldStore[P], ref wire.CasObjectRef) (PartialObject, error) {
	if err := checkAlgorithm(ref.Algorithm); err != nil {
		return nil, err
	}
	mu, busy, maxSize, maxPartials := s.holds()
	if ref.Size > maxSize {
		return nil, ErrTooLarge
	}
	mu.Lock()
	if _, ok := busy[ref]; ok {
		mu.Unlock()
		return nil, ErrBusy
	}
	if len(busy) >= maxPartials {
		mu.Unlock()
		return nil, ErrTooManyPartials
	}
	busy[ref] = struct{}{}
	mu.Unlock()
	p, err := s.create(ref)
	if err != nil {
		s.release(ref)
		return nil, err
	}
	return p, nil
}

func (s *FSStore) create(ref wire.CasObjectRef) (*fsPartial, error) {
	if ok, err := s.complete(ref); ok || err != nil {
		if err == nil {
			err = ErrExists
		}
		return nil, err
	}
	path := s.partPath(ref)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	n := uint64(fi.Size())
	if n > ref.Size {
		if err := f.Truncate(0); err != nil {
			f.Close()
			return nil, err
		}
		n = 0
	}
	return &fsPartial{s: s, ref: ref, f: f, path: path, n: n}, nil
}

// PrunePartials removes partial prefixes not held by a transfer and not
// modified for olderThan (abandoned uploads), and returns how many it
// removed. Run it periodically; it lists the tmp directory once.
func (s *FSStore) PrunePartials(olderThan time.Duration) (int, error) {
	entries, err := os.ReadDir(s.tmpDir)
	if err != nil {
		return 0, err
	}
	held := map[string]bool{}
	s.mu.Lock()
	for ref := range s.busy {
		held[filepath.Base(s.partPath(ref))] = true
	}
	s.mu.Unlock()
	cutoff := time.Now().Add(-olderThan)
	n := 0
	for _, e := range entries {
		if held[e.Name()] || !strings.HasSuffix(e.Name(), ".part") {
			continue
		}
		fi, err := e.Info()
		if err != nil || !fi.ModTime().Before(cutoff) {
			continue
		}
		if os.Remove(filepath.Join(s.tmpDir, e.Name())) == nil {
			n++
		}
	}
	return n, nil
}

func (s *FSStore) release(ref wire.CasObjectRef) {
	s.mu.Lock()
	delete(s.busy, ref)
	s.mu.Unlock()
}

type fsPartial struct {
	s    *FSStore
	ref  wire.CasObjectRef
	f    *os.File
	path string
	n    uint64
	done bool
}

func (p *fsPartial) ReadAt(b []byte, off int64) (int, error) {
	if p.done {
		return 0, ErrClosed
	}
	if off >= int64(p.n) {
		return 0, io.EOF
	}
	if rest := int64(p.n) - off; int64(len(b)) > rest {
		b = b[:rest]
	}
	return p.f.ReadAt(b, off)
}

func (p *fsPartial) Len() uint64 { return p.n }

func (p *fsPartial) Append(b []byte) error {
	if p.done {
		return ErrClosed
	}
	if uint64(len(b)) > p.ref.Size-p.n {
		return ErrTooLarge
	}
	k, err := p.f.WriteAt(b, int64(p.n))
	p.n += uint64(k)
	return err
}

func (p *fsPartial) end() error {
	if p.done {
		return ErrClosed
	}
	p.done = true
	p.s.release(p.ref)
	return nil
}

func (p *fsPartial) Commit() error {
	if p.done {
		return ErrClosed
	}
	if p.n != p.ref.Size {
		return fmt.Errorf("cas: commit %s with %d of %d bytes", p.ref, p.n, p.ref.Size)
	}
	err := p.f.Sync()
	if cerr := p.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		dst := p.s.objPath(p.ref)
		if err = os.MkdirAll(filepath.Dir(dst), 0o755); err == nil {
			// The object's name is durable once Commit returns: the
			// directories are fsynced after the rename.
			err = atomicfile.Rename(p.path, dst)
		}
	}
	if err != nil {
		_ = os.Remove(p.path)
	}
	_ = p.end()
	return err
}

func (p *fsPartial) Abort() error {
	if p.done {
		return ErrClosed
	}
	p.f.Close()
	err := os.Remove(p.path)
	_ = p.end()
	return err
}

func (p *fsPartial) Close() error {
	if p.done {
		return nil
	}
	err := p.f.Close()
	_ = p.end()
	return err
}

// ObjectInfo describes one complete stored object, for retention.
type ObjectInfo struct {
	Ref wire.CasObjectRef
	// Stored is when the object was committed (its last modification).
	Stored time.Time
}

// Collector is implemented by the stores whose objects retention may
// delete (FSStore and BucketStore).
type Collector interface {
	// Objects calls fn for every complete object; an error from fn ends
	// the walk and is returned.
	Objects(fn func(ObjectInfo) error) error
	// Delete removes a complete object (ErrBusy while a transfer of it is
	// in progress here); deleting a missing object succeeds.
	Delete(ref wire.CasObjectRef) error
	// PrunePartials removes abandoned partial objects older than olderThan.
	PrunePartials(olderThan time.Duration) (int, error)
}

var (
	_ Collector = (*FSStore)(nil)
	_ Collector = (*BucketStore)(nil)
)

// NumShards is how many shards ShardCollector splits the objects into:
// one per value of a digest's first byte, the two hex digits that name
// an object's directory (FSStore) or key prefix (BucketStore).
const NumShards = 256

// ShardCollector is a Collector that lists one shard at a time, so
// retention can page through a large store instead of listing all of it
// on every run (FSStore, BucketStore).
type ShardCollector interface {
	Collector
	// ShardObjects calls fn for the complete objects of shard (0 to
	// NumShards-1: the digests whose first byte is shard) whose hex digest
	// sorts after after ("" for all), in digest order.
	ShardObjects(shard int, after string, fn func(ObjectInfo) error) error
}

var (
	_ ShardCollector = (*FSStore)(nil)
	_ ShardCollector = (*BucketStore)(nil)
)

// ShardObjects implements ShardCollector: it reads the directory
// Dir/objects/sha256/<hh>.
func (s *FSStore) ShardObjects(shard int, after string, fn func(ObjectInfo) error) error {
	if shard < 0 || shard >= NumShards {
		return fmt.Errorf("cas: shard %d out of range", shard)
	}
	es, err := os.ReadDir(filepath.Join(s.objDir, "sha256", fmt.Sprintf("%02x", shard)))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range es { // sorted by name: the hex digest
		if e.IsDir() || e.Name() <= after {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		ref, ok := parseHexSize(e.Name(), strconv.FormatInt(fi.Size(), 10))
		if !ok {
			continue
		}
		if err := fn(ObjectInfo{Ref: ref, Stored: fi.ModTime()}); err != nil {
			return err
		}
	}
	return nil
}

// Objects implements Collector: it walks Dir/objects/sha256.
func (s *FSStore) Objects(fn func(ObjectInfo) error) error {
	root := filepath.Join(s.objDir, "sha256")
	return filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if e.IsDir() {
			return nil
		}
		fi, err := e.Info()
		if err != nil {
			return nil // removed meanwhile
		}
		ref, ok := parseHexSize(e.Name(), strconv.FormatInt(fi.Size(), 10))
		if !ok {
			return nil
		}
		return fn(ObjectInfo{Ref: ref, Stored: fi.ModTime()})
	})
}

// Delete implements Collector.
func (s *FSStore) Delete(ref wire.CasObjectRef) error {
	s.mu.Lock()
	_, held := s.busy[ref]
	s.mu.Unlock()
	if held {
		return ErrBusy
	}
	if ok, err := s.complete(ref); err != nil || !ok {
		return err // missing, or a file of another size: not this object
	}
	if err := os.Remove(s.objPath(ref)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Probe tests that the store can write and sync a small file (a daemon
// probes a store that failed, to notice its recovery).
func (s *FSStore) Probe() error { return probe.Dir(s.tmpDir) }

// Probe tests that the bucket takes a small object.
func (s *BucketStore) Probe() error {
	ctx, cancel := s.ctx()
	defer cancel()
	return probe.Bucket(ctx, s.b, s.prefix)
}

// Reachable reports whether the store's object directory is there: a
// stat, for a health prober that runs every few seconds (Probe, which
// writes, is for a store known failing). ctx is unused.
func (s *FSStore) Reachable(ctx context.Context) error {
	fi, err := os.Stat(s.objDir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("cas: %s is not a directory", s.objDir)
	}
	return nil
}
