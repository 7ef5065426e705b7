// Package castest is the conformance suite of cas.ContentStore: FSStore,
// and BucketStore over the filesystem objstore.Dir and over S3
// (internal/testkit/s3test), run the same tests.
package castest

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/wire"
)

// Store is what the suite needs of a store: the ContentStore and its
// retention side.
type Store interface {
	cas.ContentStore
	cas.Collector
}

// Factory returns, per call, a new empty backing storage and a function
// that opens a store on it; each call of open is another process (or
// daemon) sharing the same storage.
type Factory func(t *testing.T) (open func() Store)

// Ref returns the reference of data.
func Ref(data []byte) wire.CasObjectRef {
	return wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: sha256.Sum256(data), Size: uint64(len(data))}
}

// Data returns n deterministic bytes differing by seed.
func Data(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
	return b
}

// Put stores data completely in s.
func Put(t testing.TB, s cas.ContentStore, data []byte) wire.CasObjectRef {
	t.Helper()
	ref := Ref(data)
	p, err := s.Create(ref)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	for off := 0; off < len(data); off += 3000 {
		if err := p.Append(data[off:min(off+3000, len(data))]); err != nil {
			t.Fatalf("Append: %v", err)
		}
	}
	if err := p.Commit(); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	return ref
}

// begin starts a transfer of data into s: it creates data's object and
// appends its first n bytes.
func begin(t *testing.T, s cas.ContentStore, data []byte, n int) cas.PartialObject {
	t.Helper()
	p, err := s.Create(Ref(data))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Append(data[:n]); err != nil {
		t.Fatal(err)
	}
	return p
}

func read(t *testing.T, s cas.Source, ref wire.CasObjectRef, off uint64) []byte {
	t.Helper()
	r, err := s.Open(ref, off)
	if err != nil {
		t.Fatalf("Open(%d): %v", off, err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return b
}

// Run runs the suite.
func Run(t *testing.T, newStore Factory) {
	t.Run("RoundTrip", func(t *testing.T) { testRoundTrip(t, newStore) })
	t.Run("Empty", func(t *testing.T) { testEmpty(t, newStore) })
	t.Run("NotFound", func(t *testing.T) { testNotFound(t, newStore) })
	t.Run("Limits", func(t *testing.T) { testLimits(t, newStore) })
	t.Run("ResumeAcrossStores", func(t *testing.T) { testResumeAcrossStores(t, newStore) })
	t.Run("LateWriterAfterResume", func(t *testing.T) { testLateWriterAfterResume(t, newStore) })
	t.Run("Abort", func(t *testing.T) { testAbort(t, newStore) })
	t.Run("ObjectsDelete", func(t *testing.T) { testObjectsDelete(t, newStore) })
	t.Run("PrunePartials", func(t *testing.T) { testPrunePartials(t, newStore) })
}

// testRoundTrip is the RoundTrip case: a stored object reads back whole and from any offset, and cannot be created again.
func testRoundTrip(t *testing.T, newStore Factory) {
	s := newStore(t)()
	data := Data(50_000, 1)
	ref := Put(t, s, data)
	if st, err := s.Stat(ref); err != nil || !st.Complete {
		t.Fatalf("Stat = %+v, %v", st, err)
	}
	if !bytes.Equal(read(t, s, ref, 0), data) {
		t.Fatal("content differs")
	}
	if !bytes.Equal(read(t, s, ref, 12_345), data[12_345:]) {
		t.Fatal("content from an offset differs")
	}
	if len(read(t, s, ref, ref.Size)) != 0 {
		t.Fatal("content at the end is not empty")
	}
	if _, err := s.Create(ref); !errors.Is(err, cas.ErrExists) {
		t.Fatalf("Create of a stored object: %v", err)
	}
}

// testEmpty is the Empty case: an empty object is stored and reads back empty.
func testEmpty(t *testing.T, newStore Factory) {
	s := newStore(t)()
	ref := Put(t, s, nil)
	if st, _ := s.Stat(ref); !st.Complete || len(read(t, s, ref, 0)) != 0 {
		t.Fatalf("empty object: %+v", st)
	}
}

// testNotFound is the NotFound case: an object never stored has no status and does not open.
func testNotFound(t *testing.T, newStore Factory) {
	s := newStore(t)()
	ref := Ref([]byte("never stored"))
	if st, err := s.Stat(ref); err != nil || st != (cas.Status{}) {
		t.Fatalf("Stat = %+v, %v", st, err)
	}
	if _, err := s.Open(ref, 0); !errors.Is(err, cas.ErrNotFound) {
		t.Fatalf("Open: %v", err)
	}
}

// testLimits is the Limits case: a transfer is held by one writer, bounded by its size, checked at Commit and closed after its end; BLAKE3 is refused.
func testLimits(t *testing.T, newStore Factory) {
	s := newStore(t)()
	data := Data(1000, 2)
	ref := Ref(data)
	p, err := s.Create(ref)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ref); !errors.Is(err, cas.ErrBusy) {
		t.Fatalf("second Create while held: %v", err)
	}
	if err := p.Append(Data(1001, 2)); !errors.Is(err, cas.ErrTooLarge) || p.Len() != 0 {
		t.Fatalf("Append beyond size: %v, Len %d", err, p.Len())
	}
	if err := p.Append(data[:10]); err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(); err == nil {
		t.Fatal("Commit of a short object succeeded")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Append(data); !errors.Is(err, cas.ErrClosed) {
		t.Fatalf("Append after the end: %v", err)
	}
	bad := ref
	bad.Algorithm = wire.DigestBLAKE3
	if _, err := s.Create(bad); !errors.Is(err, cas.ErrUnsupportedAlgorithm) {
		t.Fatalf("Create BLAKE3: %v", err)
	}
}

// testResumeAcrossStores is the ResumeAcrossStores case: another store on the same storage resumes a cut transfer from its verified prefix.
func testResumeAcrossStores(t *testing.T, newStore Factory) {
	open := newStore(t)
	a, b := open(), open()
	data := Data(40_000, 3)
	ref := Ref(data)
	p := begin(t, a, data, 17_000)
	if err := p.Close(); err != nil { // the transfer was cut: keep the prefix
		t.Fatal(err)
	}
	// Another store on the same storage (another daemon) sees the
	// verified prefix and continues from it.
	if st, err := b.Stat(ref); err != nil || st.Partial != 17_000 || st.Complete {
		t.Fatalf("Stat on the other store = %+v, %v", st, err)
	}
	q, err := b.Create(ref)
	if err != nil {
		t.Fatal(err)
	}
	if q.Len() != 17_000 {
		t.Fatalf("resumed Len = %d", q.Len())
	}
	prefix := make([]byte, 17_000)
	if n, err := q.ReadAt(prefix, 0); n != len(prefix) || (err != nil && err != io.EOF) || !bytes.Equal(prefix, data[:17_000]) {
		t.Fatalf("ReadAt of the prefix: %d, %v", n, err)
	}
	if err := q.Append(data[17_000:]); err != nil {
		t.Fatal(err)
	}
	if err := q.Commit(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(read(t, a, ref, 0), data) {
		t.Fatal("the first store reads other content")
	}
}

// testLateWriterAfterResume is the LateWriterAfterResume case: an old holder ending its transfer after another store committed the object leaves it intact.
func testLateWriterAfterResume(t *testing.T, newStore Factory) {
	// The old holder (a daemon the agent left) ends its transfer after
	// another store resumed and committed the object: the object stays
	// intact.
	open := newStore(t)
	a, b := open(), open()
	data := Data(30_000, 9)
	ref := Ref(data)
	p := begin(t, a, data, 10_000)
	q, err := b.Create(ref)
	if err != nil {
		t.Fatal(err)
	}
	if q.Len() > 10_000 {
		t.Fatalf("resumed Len %d beyond what was sent", q.Len())
	}
	if err := q.Append(data[q.Len():]); err != nil {
		t.Fatal(err)
	}
	if err := q.Commit(); err != nil {
		t.Fatal(err)
	}
	_ = p.Close() // the late flush
	for _, s := range []Store{a, b, open()} {
		if !bytes.Equal(read(t, s, ref, 0), data) {
			t.Fatal("object damaged by the late writer")
		}
	}
}

// testAbort is the Abort case: an aborted transfer leaves nothing behind.
func testAbort(t *testing.T, newStore Factory) {
	s := newStore(t)()
	data := Data(9000, 4)
	ref := Ref(data)
	p := begin(t, s, data, 5000)
	if err := p.Abort(); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Stat(ref); err != nil || st != (cas.Status{}) {
		t.Fatalf("after Abort Stat = %+v, %v", st, err)
	}
}

// testObjectsDelete is the ObjectsDelete case: Objects lists the stored objects and Delete removes one (twice without error).
func testObjectsDelete(t *testing.T, newStore Factory) {
	s := newStore(t)()
	r1, r2 := Put(t, s, Data(100, 5)), Put(t, s, Data(200, 6))
	got := map[wire.CasObjectRef]bool{}
	if err := s.Objects(func(o cas.ObjectInfo) error {
		if o.Stored.IsZero() {
			t.Errorf("%s: no stored time", o.Ref)
		}
		got[o.Ref] = true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got[r1] || !got[r2] {
		t.Fatalf("Objects = %v", got)
	}
	if err := s.Delete(r1); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(r1); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	if _, err := s.Open(r1, 0); !errors.Is(err, cas.ErrNotFound) {
		t.Fatalf("Open after Delete: %v", err)
	}
	if st, _ := s.Stat(r1); st.Complete || st.Partial != 0 {
		t.Fatalf("Stat after Delete = %+v", st)
	}
	if st, _ := s.Stat(r2); !st.Complete {
		t.Fatal("the other object went too")
	}
}

// testPrunePartials is the PrunePartials case: PrunePartials removes only old partials no transfer holds.
func testPrunePartials(t *testing.T, newStore Factory) {
	s := newStore(t)()
	data := Data(3000, 7)
	ref := Ref(data)
	p, _ := s.Create(ref)
	_ = p.Append(data[:1000])
	held := Ref(Data(10, 8))
	h, _ := s.Create(held)
	_ = h.Append(Data(10, 8)[:5])
	if n, err := s.PrunePartials(-time.Second); err != nil || n != 0 {
		t.Fatalf("pruned a partial held by a transfer: %d, %v", n, err)
	}
	_ = p.Close()
	if n, err := s.PrunePartials(time.Hour); err != nil || n != 0 {
		t.Fatalf("pruned a recent partial: %d, %v", n, err)
	}
	if n, err := s.PrunePartials(-time.Second); err != nil || n != 1 {
		t.Fatalf("PrunePartials = %d, %v; want 1", n, err)
	}
	if st, _ := s.Stat(ref); st.Partial != 0 {
		t.Fatalf("after pruning Stat = %+v", st)
	}
	_ = h.Close()
}
