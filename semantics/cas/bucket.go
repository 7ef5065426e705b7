package cas

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"forgeyard.dev/transport/semantics/internal/pairkey"
	"forgeyard.dev/transport/semantics/objstore"
	"forgeyard.dev/transport/wire"
)

// DefaultChunkSize is the size of the chunk objects a BucketStore writes a
// partial object in, when BucketStoreConfig.ChunkSize is 0.
const DefaultChunkSize = 4 << 20

// BucketStore is the ContentStore over an objstore.Bucket, for daemons
// that share their objects (HA on S3, docs/protocols/internal/cas-transfer.md
// "Shared stores"). Layout under Prefix:
//
//	chunks/<alg>-<hex>-<size>/<offset, 20 digits>-<length>   the received bytes, in chunks of ChunkSize
//	objects/<alg>/<hh>/<hex>-<size>                  the manifest: the object is complete
//
// A partial object's stored prefix is the contiguous run of chunks from
// offset 0; it survives the daemon (a chunk is a whole object, written at
// once), so another daemon sharing the bucket resumes the upload from the
// same verified prefix. Commit writes the manifest, a small JSON document
// listing the chunks that make up the object, so publishing copies no
// data. Chunk names derive from the object's digest and the offset: two
// writers of the same name write the same bytes.
//
// Append buffers up to ChunkSize bytes in memory before writing a chunk;
// Close and Commit write the buffer. Safe for concurrent use; ErrBusy
// holds within one process only.
type BucketStore struct {
	b           objstore.Bucket
	prefix      string
	chunk       int
	maxSize     uint64
	maxPartials int
	timeout     time.Duration

	mu   sync.Mutex
	busy map[wire.CasObjectRef]struct{}
}

// BucketStoreConfig configures a BucketStore. Zero fields take defaults.
type BucketStoreConfig struct {
	Bucket objstore.Bucket // required
	// Prefix is prepended to every key (e.g. "cas/"); "" for none.
	Prefix string
	// ChunkSize is the size of a chunk object; 0 means DefaultChunkSize.
	ChunkSize int
	// MaxObjectSize and MaxPartials as in FSStoreConfig.
	MaxObjectSize uint64
	MaxPartials   int
	// Timeout bounds one store operation (a chunk write, a listing); 0
	// means a minute.
	Timeout time.Duration
}

// NewBucketStore returns the store of cfg.
func NewBucketStore(cfg BucketStoreConfig) (*BucketStore, error) {
	switch {
	case cfg.Bucket == nil:
		return nil, errors.New("cas: BucketStoreConfig.Bucket is required")
	case cfg.ChunkSize < 0 || cfg.MaxPartials < 0:
		return nil, errors.New("cas: BucketStoreConfig.ChunkSize and MaxPartials must be ≥ 0")
	}
	s := &BucketStore{b: cfg.Bucket, prefix: cfg.Prefix, chunk: cfg.ChunkSize, maxSize: cfg.MaxObjectSize,
		maxPartials: cfg.MaxPartials, timeout: cfg.Timeout, busy: map[wire.CasObjectRef]struct{}{}}
	orDefault(&s.chunk, DefaultChunkSize)
	orDefault(&s.maxSize, DefaultMaxObjectSize)
	orDefault(&s.maxPartials, DefaultMaxPartials)
	if s.timeout <= 0 {
		s.timeout = time.Minute
	}
	return s, nil
}

var _ ContentStore = (*BucketStore)(nil)

// MaxObjectSize returns the store's object size bound in bytes.
func (s *BucketStore) MaxObjectSize() uint64 { return s.maxSize }

func (s *BucketStore) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.timeout)
}

func (s *BucketStore) chunkDir(ref wire.CasObjectRef) string {
	return fmt.Sprintf("%schunks/%s-%s-%d/", s.prefix, algName(ref.Algorithm), ref.Digest, ref.Size)
}

// chunkKey names a chunk by offset and length: a late writer (a daemon the
// agent already left) flushing a chunk at the same offset with another
// length never replaces the chunk a manifest names.
func (s *BucketStore) chunkKey(ref wire.CasObjectRef, off, n uint64) string {
	return fmt.Sprintf("%s%020d-%d", s.chunkDir(ref), off, n)
}

func (s *BucketStore) manifestKey(ref wire.CasObjectRef) string {
	h := ref.Digest.String()
	return fmt.Sprintf("%sobjects/%s/%s/%s-%d", s.prefix, algName(ref.Algorithm), h[:2], h, ref.Size)
}

// piece is one chunk's contribution to an object: bytes [From, Size) of the
// chunk at offset Off.
type piece struct {
	Off, Size, From uint64
}

type manifest struct {
	V      int         `json:"v"`
	Size   uint64      `json:"size"`
	Pieces [][3]uint64 `json:"pieces"` // off, size, from
}

// prefix lists the chunks of ref and returns the pieces covering the
// contiguous prefix from 0 and its length.
func (s *BucketStore) prefixOf(ctx context.Context, ref wire.CasObjectRef) ([]piece, uint64, error) {
	dir := s.chunkDir(ref)
	var chunks []piece
	err := s.b.List(ctx, dir, func(in objstore.Info) error {
		off, size, ok := pairkey.Split(in.Key, dir)
		if !ok || size == 0 || in.Size != int64(size) {
			return nil // not a chunk of ours
		}
		chunks = append(chunks, piece{Off: off, Size: size})
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	// By offset, the longest first at one offset.
	sort.Slice(chunks, func(i, j int) bool {
		if chunks[i].Off != chunks[j].Off {
			return chunks[i].Off < chunks[j].Off
		}
		return chunks[i].Size > chunks[j].Size
	})
	var out []piece
	var cur uint64
	for _, c := range chunks {
		if c.Off > cur {
			break // a gap: the rest is not part of the prefix
		}
		if end := c.Off + c.Size; end > cur {
			out = append(out, piece{Off: c.Off, Size: c.Size, From: cur - c.Off})
			cur = end
		}
	}
	if cur > ref.Size {
		return nil, 0, nil // corrupt: more bytes than the object has; Create starts over
	}
	return out, cur, nil
}

func (s *BucketStore) readManifest(ctx context.Context, ref wire.CasObjectRef) (*manifest, error) {
	r, err := s.b.Get(ctx, s.manifestKey(ref), 0, -1)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, 16<<20))
	if err != nil {
		return nil, err
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil || m.Size != ref.Size {
		return nil, fmt.Errorf("cas: corrupt manifest of %s", ref)
	}
	var sum uint64
	for _, p := range m.Pieces {
		sum += p[1] - p[2]
	}
	if sum != ref.Size {
		return nil, fmt.Errorf("cas: corrupt manifest of %s", ref)
	}
	return &m, nil
}

func (s *BucketStore) complete(ctx context.Context, ref wire.CasObjectRef) (bool, error) {
	_, err := s.b.Stat(ctx, s.manifestKey(ref))
	if errors.Is(err, objstore.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// Stat implements ContentStore.
func (s *BucketStore) Stat(ref wire.CasObjectRef) (Status, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	if ok, err := s.complete(ctx, ref); ok || err != nil {
		return Status{Complete: ok}, err
	}
	_, n, err := s.prefixOf(ctx, ref)
	return Status{Partial: n}, err
}

// Open implements Source.
func (s *BucketStore) Open(ref wire.CasObjectRef, offset uint64) (io.ReadCloser, error) {
	if offset > ref.Size {
		return nil, fmt.Errorf("cas: open %s at %d: offset beyond size", ref, offset)
	}
	ctx, cancel := s.ctx()
	defer cancel()
	m, err := s.readManifest(ctx, ref)
	if errors.Is(err, objstore.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	ps := make([]piece, len(m.Pieces))
	for i, p := range m.Pieces {
		ps[i] = piece{Off: p[0], Size: p[1], From: p[2]}
	}
	return &chunkReader{s: s, ref: ref, pieces: ps, pos: offset}, nil
}

// chunkReader reads an object's pieces in order from pos, one chunk GET at
// a time.
type chunkReader struct {
	s      *BucketStore
	ref    wire.CasObjectRef
	pieces []piece
	pos    uint64 // logical offset of the next byte
	cur    io.ReadCloser
	closed bool
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if r.closed {
		return 0, ErrClosed
	}
	for {
		if r.cur != nil {
			n, err := r.cur.Read(p)
			r.pos += uint64(n)
			if err == io.EOF {
				r.cur.Close()
				r.cur = nil
				if n > 0 {
					return n, nil
				}
				continue
			}
			return n, err
		}
		if r.pos >= r.ref.Size {
			return 0, io.EOF
		}
		// Find the piece holding pos: pieces cover [Off+From, Off+Size).
		var pc *piece
		for i := range r.pieces {
			if q := &r.pieces[i]; q.Off+q.From <= r.pos && r.pos < q.Off+q.Size {
				pc = q
				break
			}
		}
		if pc == nil {
			return 0, fmt.Errorf("cas: object %s: no chunk holds offset %d", r.ref, r.pos)
		}
		rc, err := r.s.b.Get(context.Background(), r.s.chunkKey(r.ref, pc.Off, pc.Size), int64(r.pos-pc.Off), int64(pc.Off+pc.Size-r.pos))
		if err != nil {
			return 0, err
		}
		r.cur = rc
	}
}

func (r *chunkReader) Close() error {
	r.closed = true
	if r.cur != nil {
		err := r.cur.Close()
		r.cur = nil
		return err
	}
	return nil
}

// Create implements ContentStore.
func (s *BucketStore) Create(ref wire.CasObjectRef) (PartialObject, error) {
	return createHeld[*bucketPartial](s, ref)
}

func (s *BucketStore) holds() (*sync.Mutex, map[wire.CasObjectRef]struct{}, uint64, int) {
	return &s.mu, s.busy, s.maxSize, s.maxPartials
}

func (s *BucketStore) create(ref wire.CasObjectRef) (*bucketPartial, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	if ok, err := s.complete(ctx, ref); ok || err != nil {
		if err == nil {
			err = ErrExists
		}
		return nil, err
	}
	ps, n, err := s.prefixOf(ctx, ref)
	if err != nil {
		return nil, err
	}
	if n == 0 && len(ps) == 0 {
		// Nothing usable: drop any leftover (gapped or corrupt) chunks.
		if err := s.deleteChunks(ctx, ref); err != nil {
			return nil, err
		}
	}
	return &bucketPartial{s: s, ref: ref, pieces: ps, stored: n}, nil
}

func (s *BucketStore) deleteChunks(ctx context.Context, ref wire.CasObjectRef) error {
	var keys []string
	if err := s.b.List(ctx, s.chunkDir(ref), func(in objstore.Info) error {
		keys = append(keys, in.Key)
		return nil
	}); err != nil {
		return err
	}
	for _, k := range keys {
		if err := s.b.Delete(ctx, k); err != nil {
			return err
		}
	}
	return nil
}

func (s *BucketStore) release(ref wire.CasObjectRef) {
	s.mu.Lock()
	delete(s.busy, ref)
	s.mu.Unlock()
}

// parseChunkDir parses "<alg>-<hex>-<size>" (a chunks/ directory name).
func parseChunkDir(name string) (wire.CasObjectRef, bool) {
	parts := strings.Split(name, "-")
	if len(parts) != 3 || parts[0] != "sha256" {
		return wire.CasObjectRef{}, false
	}
	return parseHexSize(parts[1], parts[2])
}

func parseHexSize(h, size string) (wire.CasObjectRef, bool) {
	ref := wire.CasObjectRef{Algorithm: wire.DigestSHA256}
	b, err := hex.DecodeString(h)
	if err != nil || len(b) != len(ref.Digest) {
		return wire.CasObjectRef{}, false
	}
	copy(ref.Digest[:], b)
	n, err := strconv.ParseUint(size, 10, 64)
	if err != nil {
		return wire.CasObjectRef{}, false
	}
	ref.Size = n
	return ref, true
}

// PrunePartials removes the chunks of partial objects not held by a
// transfer in this process, without a manifest, and not written to for
// olderThan (abandoned uploads). It returns how many partial objects it
// removed. In a shared bucket pick olderThan well above the lease TTL, so
// an upload another daemon is receiving is never pruned.
func (s *BucketStore) PrunePartials(olderThan time.Duration) (int, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	type partial struct {
		ref    wire.CasObjectRef
		newest time.Time
		keys   []string
	}
	byDir := map[string]*partial{}
	var order []string
	root := s.prefix + "chunks/"
	err := s.b.List(ctx, root, func(in objstore.Info) error {
		rest := strings.TrimPrefix(in.Key, root)
		i := strings.IndexByte(rest, '/')
		if i < 0 {
			return nil
		}
		ref, ok := parseChunkDir(rest[:i])
		if !ok {
			return nil
		}
		p := byDir[rest[:i]]
		if p == nil {
			p = &partial{ref: ref}
			byDir[rest[:i]] = p
			order = append(order, rest[:i])
		}
		if in.Modified.After(p.newest) {
			p.newest = in.Modified
		}
		p.keys = append(p.keys, in.Key)
		return nil
	})
	if err != nil {
		return 0, err
	}
	cutoff := time.Now().Add(-olderThan)
	n := 0
	for _, d := range order {
		p := byDir[d]
		s.mu.Lock()
		_, held := s.busy[p.ref]
		s.mu.Unlock()
		if held || !p.newest.Before(cutoff) {
			continue
		}
		if ok, err := s.complete(ctx, p.ref); ok || err != nil {
			continue // committed: the chunks are the object
		}
		removed := true
		for _, k := range p.keys {
			if s.b.Delete(ctx, k) != nil {
				removed = false
			}
		}
		if removed {
			n++
		}
	}
	return n, nil
}

// Objects calls fn for every complete object (for retention), in key
// order; Stored is when it was committed.
func (s *BucketStore) Objects(fn func(ObjectInfo) error) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root := s.prefix + "objects/"
	return s.b.List(ctx, root, func(in objstore.Info) error {
		name := in.Key[strings.LastIndexByte(in.Key, '/')+1:]
		i := strings.LastIndexByte(name, '-')
		if i < 0 || !strings.HasPrefix(strings.TrimPrefix(in.Key, root), "sha256/") {
			return nil
		}
		ref, ok := parseHexSize(name[:i], name[i+1:])
		if !ok {
			return nil
		}
		return fn(ObjectInfo{Ref: ref, Stored: in.Modified})
	})
}

// ShardObjects implements ShardCollector: it lists the key prefix
// objects/sha256/<hh>/ only.
func (s *BucketStore) ShardObjects(shard int, after string, fn func(ObjectInfo) error) error {
	if shard < 0 || shard >= NumShards {
		return fmt.Errorf("cas: shard %d out of range", shard)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	return s.b.List(ctx, fmt.Sprintf("%sobjects/sha256/%02x/", s.prefix, shard), func(in objstore.Info) error {
		name := in.Key[strings.LastIndexByte(in.Key, '/')+1:]
		i := strings.LastIndexByte(name, '-')
		if i < 0 || name[:i] <= after {
			return nil
		}
		ref, ok := parseHexSize(name[:i], name[i+1:])
		if !ok {
			return nil
		}
		return fn(ObjectInfo{Ref: ref, Stored: in.Modified})
	})
}

// Delete removes a complete object: its manifest first (it is no longer
// visible), then its chunks. Deleting a missing object succeeds.
func (s *BucketStore) Delete(ref wire.CasObjectRef) error {
	ctx, cancel := s.ctx()
	defer cancel()
	s.mu.Lock()
	_, held := s.busy[ref]
	s.mu.Unlock()
	if held {
		return ErrBusy
	}
	if err := s.b.Delete(ctx, s.manifestKey(ref)); err != nil {
		return err
	}
	return s.deleteChunks(ctx, ref)
}

type bucketPartial struct {
	s      *BucketStore
	ref    wire.CasObjectRef
	pieces []piece // stored chunks
	stored uint64  // bytes in stored chunks
	buf    []byte  // appended, not yet written (at offset stored)
	done   bool
}

func (p *bucketPartial) Len() uint64 { return p.stored + uint64(len(p.buf)) }

func (p *bucketPartial) ReadAt(b []byte, off int64) (int, error) {
	if p.done {
		return 0, ErrClosed
	}
	o := uint64(off)
	if o >= p.Len() {
		return 0, io.EOF
	}
	if rest := p.Len() - o; uint64(len(b)) > rest {
		b = b[:rest]
	}
	n := 0
	for n < len(b) {
		pos := o + uint64(n)
		if pos >= p.stored {
			n += copy(b[n:], p.buf[pos-p.stored:])
			continue
		}
		var pc *piece
		for i := range p.pieces {
			if q := &p.pieces[i]; q.Off+q.From <= pos && pos < q.Off+q.Size {
				pc = q
				break
			}
		}
		if pc == nil {
			return n, fmt.Errorf("cas: partial %s: no chunk holds offset %d", p.ref, pos)
		}
		want := min(uint64(len(b)-n), pc.Off+pc.Size-pos)
		ctx, cancel := p.s.ctx()
		r, err := p.s.b.Get(ctx, p.s.chunkKey(p.ref, pc.Off, pc.Size), int64(pos-pc.Off), int64(want))
		if err != nil {
			cancel()
			return n, err
		}
		k, err := io.ReadFull(r, b[n:n+int(want)])
		r.Close()
		cancel()
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (p *bucketPartial) Append(b []byte) error {
	if p.done {
		return ErrClosed
	}
	if uint64(len(b)) > p.ref.Size-p.Len() {
		return ErrTooLarge
	}
	for len(b) > 0 {
		k := min(len(b), p.s.chunk-len(p.buf))
		p.buf = append(p.buf, b[:k]...)
		b = b[k:]
		if len(p.buf) >= p.s.chunk {
			if err := p.flush(); err != nil {
				return err
			}
		}
	}
	return nil
}

// flush writes the buffer as the chunk at offset stored.
func (p *bucketPartial) flush() error {
	if len(p.buf) == 0 {
		return nil
	}
	ctx, cancel := p.s.ctx()
	defer cancel()
	if err := p.s.b.Put(ctx, p.s.chunkKey(p.ref, p.stored, uint64(len(p.buf))), bytes.NewReader(p.buf), int64(len(p.buf))); err != nil {
		// The buffer is kept: the caller sees the error and ends the
		// transfer; what is stored stays the verified prefix.
		return err
	}
	p.pieces = append(p.pieces, piece{Off: p.stored, Size: uint64(len(p.buf))})
	p.stored += uint64(len(p.buf))
	p.buf = p.buf[:0]
	return nil
}

func (p *bucketPartial) end() {
	p.done = true
	p.buf = nil
	p.s.release(p.ref)
}

func (p *bucketPartial) Commit() error {
	if p.done {
		return ErrClosed
	}
	if p.Len() != p.ref.Size {
		return fmt.Errorf("cas: commit %s with %d of %d bytes", p.ref, p.Len(), p.ref.Size)
	}
	defer p.end()
	if err := p.flush(); err != nil {
		return err
	}
	m := manifest{V: 1, Size: p.ref.Size, Pieces: make([][3]uint64, len(p.pieces))}
	for i, pc := range p.pieces {
		m.Pieces[i] = [3]uint64{pc.Off, pc.Size, pc.From}
	}
	b, err := json.Marshal(&m)
	if err != nil {
		return err
	}
	ctx, cancel := p.s.ctx()
	defer cancel()
	return p.s.b.Put(ctx, p.s.manifestKey(p.ref), bytes.NewReader(b), int64(len(b)))
}

func (p *bucketPartial) Abort() error {
	if p.done {
		return ErrClosed
	}
	defer p.end()
	ctx, cancel := p.s.ctx()
	defer cancel()
	return p.s.deleteChunks(ctx, p.ref)
}

func (p *bucketPartial) Close() error {
	if p.done {
		return nil
	}
	defer p.end()
	return p.flush()
}

// Reachable reports whether the bucket answers (objstore.Probe): a cheap
// lookup that reads and writes nothing, for a health prober that runs
// every few seconds (Probe, which writes, is for a store known failing).
func (s *BucketStore) Reachable(ctx context.Context) error { return objstore.Probe(ctx, s.b) }
