package cas_test

import (
	"context"
	"io"
	"sync/atomic"
	"testing"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/internal/testkit/testbackends"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/wire"
)

// BenchmarkCAS measures one 32 MiB object per iteration: uploaded
// (verified and committed by the daemon), downloaded (verified and
// committed by the agent), and the raw throughput of one stream of the
// same Conn at CAS priority (no hashing, no store) for comparison.
//
//	go test ./semantics/cas -run '^$' -bench CAS -benchtime 10x
func BenchmarkCAS(b *testing.B) {
	const size = 32 << 20
	o := newObject(size, 1)
	for _, backend := range testbackends.All {
		b.Run(backend, func(b *testing.B) {
			lease := wire.NewLeaseId()
			local := newStore(b, 0)
			put(b, local, o)
			a := newAuth()
			a.allow(lease, cas.AccessRead|cas.AccessWrite, o)
			remote := newStore(b, 0)
			put(b, remote, o)
			dynamic := &switchStore{}
			dynamic.set(remote)
			srv := newServer(b, dynamic, a, nil)
			bc, bs := testbackends.Pair(b, backend, memory.Options{})
			l := newLink(b, srv, bc, bs)
			ctx := context.Background()
			b.Run("raw", func(b *testing.B) {
				buf := make([]byte, cas.DefaultBufferSize)
				b.SetBytes(size)
				for i := 0; i < b.N; i++ {
					st, err := l.agent.OpenStream(ctx, wire.StreamDiagnostic)
					if err != nil {
						b.Fatal(err)
					}
					st.SetPriority(semantics.PriorityCAS)
					for n := 0; n < size; n += len(buf) {
						if _, err := st.Write(buf); err != nil {
							b.Fatal(err)
						}
					}
					_ = st.SendStream.Close()
					if _, err := st.ReadFrame(); err == nil {
						b.Fatal("sink answered")
					}
				}
			})
			b.Run("upload", func(b *testing.B) {
				up := newUploader(b, local, nil)
				b.SetBytes(size)
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					dynamic.set(newStore(b, 0))
					b.StartTimer()
					if err := up.Upload(ctx, l.agent, lease, o.ref); err != nil {
						b.Fatal(err)
					}
				}
			})
			dynamic.set(remote)
			b.Run("download", func(b *testing.B) {
				b.SetBytes(size)
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					dl := newDownloader(b, newStore(b, 0))
					b.StartTimer()
					if err := dl.Fetch(ctx, l.agent, lease, o.ref); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkResumeAfterCut reports the bytes re-sent to finish an upload
// cut at 50 % of its bytes.
func BenchmarkResumeAfterCut(b *testing.B) {
	const size = 32 << 20
	o := newObject(size, 2)
	lease := wire.NewLeaseId()
	local := newStore(b, 0)
	put(b, local, o)
	a := newAuth()
	a.allow(lease, cas.AccessWrite, o)
	ctx := context.Background()
	var resent, prefix int64
	for i := 0; i < b.N; i++ {
		remote := newStore(b, 0)
		srv := newServer(b, remote, a, nil)
		up := newUploader(b, local, nil)
		l1 := newMemLink(b, srv, memory.Options{CutAfterBytes: size / 2})
		if err := up.Upload(ctx, l1.agent, lease, o.ref); err == nil {
			b.Fatal("cut upload succeeded")
		}
		l1.close()
		st, _ := remote.Stat(o.ref)
		first := up.Stats().BytesSent
		l2 := newMemLink(b, srv, memory.Options{})
		if err := up.Upload(ctx, l2.agent, lease, o.ref); err != nil {
			b.Fatal(err)
		}
		resent += up.Stats().BytesSent - first
		prefix += int64(st.Partial)
	}
	b.ReportMetric(float64(resent)/float64(b.N), "resent-B/op")
	b.ReportMetric(float64(prefix)/float64(b.N), "kept-prefix-B/op")
	b.ReportMetric(float64(resent)/float64(b.N)/size*100, "resent-%")
}

// switchStore lets a benchmark swap the daemon's store between iterations.
type switchStore struct{ p atomic.Pointer[cas.FSStore] }

func (s *switchStore) set(c *cas.FSStore) { s.p.Store(c) }

func (s *switchStore) Stat(ref wire.CasObjectRef) (cas.Status, error) { return s.p.Load().Stat(ref) }

func (s *switchStore) Open(ref wire.CasObjectRef, off uint64) (io.ReadCloser, error) {
	return s.p.Load().Open(ref, off)
}

func (s *switchStore) Create(ref wire.CasObjectRef) (cas.PartialObject, error) {
	return s.p.Load().Create(ref)
}

// BenchmarkSHA256 is the receiver's hashing cost alone, for reading the
// CAS figures next to it.
func BenchmarkSHA256(b *testing.B) {
	o := newObject(32<<20, 3)
	b.SetBytes(int64(len(o.data)))
	for i := 0; i < b.N; i++ {
		_ = refOf(o.data)
	}
}
