package relay_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/relay"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// benchPath sets up one agent connection to a raw QUIC "daemon", either
// directly over QUIC or through a relay with the given agent-side backend,
// and returns both ends.
func benchPath(b *testing.B, path string, mod ...func(*relay.Config)) (agentSide, daemonSide semantics.BackendConn) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	b.Cleanup(cancel)
	pki := trusttest.NewPKI(b)
	dl, err := quic.Listen("127.0.0.1:0", pki.ServerConfig(b, serverName), quic.Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = dl.Close() })
	var a semantics.BackendConn
	if path == "direct-quic" {
		a, err = quic.Dialer{TLS: pki.ClientConfig(b, wire.NewRunnerId(), serverName)}.Dial(ctx, dl.Addr().String())
	} else {
		cfg := upstreamTLS(b, pki)
		cfg.Upstreams = []string{dl.Addr().String()}
		cfg.Registerer = prometheus.NewRegistry()
		for _, m := range mod {
			m(cfg)
		}
		r, err := relay.New(*cfg)
		if err != nil {
			b.Fatal(err)
		}
		ln, dialer := agentListener(b, pki, path[len("relay-"):])
		go func() { _ = r.Serve(context.Background(), ln) }()
		b.Cleanup(func() { _ = r.Close() })
		a, err = dialer.Dial(ctx, ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = a.CloseWithCode(wire.CloseNormal, "") })
	d, err := dl.Accept(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = d.CloseWithCode(wire.CloseNormal, "") })
	return a, d
}

var benchPaths = []string{"direct-quic", "relay-yamux", "relay-webtransport"}

// BenchmarkRelayControlRTT: one 64-byte request and 64-byte answer on a
// control stream per op; reports the round trip's p50 and p99.
func BenchmarkRelayControlRTT(b *testing.B) {
	for _, path := range benchPaths {
		b.Run(path, func(b *testing.B) {
			a, d := benchPath(b, path)
			ctx := context.Background()
			as, err := a.OpenStream(ctx)
			if err != nil {
				b.Fatal(err)
			}
			hdr := header(wire.StreamControl)
			if _, err := as.Write(hdr); err != nil {
				b.Fatal(err)
			}
			ds, err := d.AcceptStream(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(ds, make([]byte, len(hdr))); err != nil {
				b.Fatal(err)
			}
			measureRTT(b, as, ds, b.N)
			as.CancelWrite(semantics.StreamCancelled)
		})
	}
}

// BenchmarkRelayBulk: agent → daemon throughput on a CAS upload stream,
// 256 KiB per op (MB/s).
func BenchmarkRelayBulk(b *testing.B) {
	const chunk = 256 << 10
	for _, path := range benchPaths {
		b.Run(path, func(b *testing.B) {
			a, d := benchPath(b, path)
			ctx := context.Background()
			as, err := a.OpenUniStream(ctx)
			if err != nil {
				b.Fatal(err)
			}
			hdr := header(wire.StreamCasUpload)
			if _, err := as.Write(hdr); err != nil {
				b.Fatal(err)
			}
			ds, err := d.AcceptUniStream(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(ds, make([]byte, len(hdr))); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(chunk)
			total := int64(b.N) * chunk
			got := make(chan int64, 1)
			b.ResetTimer()
			go func() {
				n, _ := io.CopyN(io.Discard, ds, total)
				got <- n
			}()
			buf := make([]byte, chunk)
			for range b.N {
				if _, err := as.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			if n := <-got; n != total {
				b.Fatalf("daemon received %d of %d bytes", n, total)
			}
			b.StopTimer()
			_ = as.Close()
		})
	}
}

// measureRTT echoes on ds and does n 64-byte round trips on as, reporting
// p50 and p99 in µs.
func measureRTT(b *testing.B, as, ds semantics.RawStream, n int) {
	go func() { // the daemon echoes
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(ds, buf); err != nil {
				return
			}
			if _, err := ds.Write(buf); err != nil {
				return
			}
		}
	}()
	req, resp := make([]byte, 64), make([]byte, 64)
	rtts := make([]time.Duration, 0, n)
	b.ResetTimer()
	for range n {
		t0 := time.Now()
		if _, err := as.Write(req); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(as, resp); err != nil {
			b.Fatal(err)
		}
		rtts = append(rtts, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(rtts)
	pct := func(p int) float64 { return float64(rtts[(len(rtts)-1)*p/100].Nanoseconds()) / 1e3 }
	b.ReportMetric(pct(50), "p50-µs")
	b.ReportMetric(pct(99), "p99-µs")
}

// BenchmarkRelayControlUnderBulk: control RTT agent → daemon → agent
// while the daemon saturates a CAS-download stream towards the agent
// through a relay over yamux, with the relay's bulk pacing (paced) and
// with it disabled (unpaced: BulkQueueThreshold < 0, BulkMaxWait 1 ns).
func BenchmarkRelayControlUnderBulk(b *testing.B) {
	for _, mode := range []string{"paced", "unpaced"} {
		b.Run(mode, func(b *testing.B) {
			var mods []func(*relay.Config)
			if mode == "unpaced" {
				mods = append(mods, func(c *relay.Config) { c.BulkQueueThreshold, c.BulkMaxWait = -1, time.Nanosecond })
			}
			a, d := benchPath(b, "relay-yamux", mods...)
			ctx := context.Background()
			// The bulk stream, daemon → agent.
			du, err := d.OpenUniStream(ctx)
			if err != nil {
				b.Fatal(err)
			}
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				buf := append(header(wire.StreamCasDownload), make([]byte, 256<<10)...)
				for {
					select {
					case <-stop:
						du.CancelWrite(semantics.StreamCancelled)
						return
					default:
					}
					if _, err := du.Write(buf); err != nil {
						return
					}
					buf = buf[:256<<10]
				}
			}()
			au, err := a.AcceptUniStream(ctx)
			if err != nil {
				b.Fatal(err)
			}
			go func() { _, _ = io.Copy(io.Discard, au) }()
			// The control stream.
			as, err := a.OpenStream(ctx)
			if err != nil {
				b.Fatal(err)
			}
			hdr := header(wire.StreamControl)
			if _, err := as.Write(hdr); err != nil {
				b.Fatal(err)
			}
			ds, err := d.AcceptStream(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(ds, make([]byte, len(hdr))); err != nil {
				b.Fatal(err)
			}
			measureRTT(b, as, ds, max(b.N, 200))
			as.CancelWrite(semantics.StreamCancelled)
		})
	}
}

// BenchmarkRelayCAS: one 32 MiB object per op uploaded through
// semantics/cas (cas.Uploader on the agent side, cas.Server on the daemon
// side over semantics.Conn, the daemon hashing every byte and committing
// only on a matching SHA-256 into a fresh FSStore), directly over QUIC and
// through a relay over yamux and over WebTransport, same run (MB/s).
//
//	go test ./relay -run '^$' -bench 'BenchmarkRelayCAS$' -benchtime 3x -count 6
func BenchmarkRelayCAS(b *testing.B) {
	const size = 32 << 20
	data := make([]byte, size)
	var x uint64 = 0x9e3779b97f4a7c15
	for i := 0; i < size; i += 8 { // incompressible, deterministic
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(data[i:], x)
	}
	ref := wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: sha256.Sum256(data), Size: size}
	local, err := cas.NewFSStore(cas.FSStoreConfig{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	p, err := local.Create(ref)
	if err != nil {
		b.Fatal(err)
	}
	if err := p.Append(data); err != nil {
		b.Fatal(err)
	}
	if err := p.Commit(); err != nil {
		b.Fatal(err)
	}
	lease := wire.NewLeaseId()
	allow := cas.AuthorizerFunc(func(_ context.Context, l wire.LeaseId, r wire.CasObjectRef, _ cas.Access) error {
		if l == lease && r == ref {
			return nil
		}
		return cas.ErrForbidden
	})
	for _, path := range benchPaths {
		b.Run(path, func(b *testing.B) {
			ab, db := benchPath(b, path)
			ac, err := semantics.NewConn(ab, semantics.Config{})
			if err != nil {
				b.Fatal(err)
			}
			dc, err := semantics.NewConn(db, semantics.Config{})
			if err != nil {
				b.Fatal(err)
			}
			remote := &benchStore{}
			srv, err := cas.NewServer(cas.ServerConfig{Store: remote, Authorizer: allow, HeaderTimeout: 10 * time.Second, IdleTimeout: 10 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			sess := srv.NewSession()
			var handlers sync.WaitGroup
			handlers.Add(1)
			go func() { // the daemon's accept loop: CAS streams only
				defer handlers.Done()
				for {
					st, err := dc.AcceptStream(context.Background())
					if err != nil {
						return
					}
					handlers.Add(1)
					go func() {
						defer handlers.Done()
						_ = sess.Handle(dc.Context(), st)
					}()
				}
			}()
			b.Cleanup(func() {
				_ = ac.CloseWithCode(wire.CloseNormal, "")
				_ = dc.CloseWithCode(wire.CloseNormal, "")
				handlers.Wait()
			})
			up, err := cas.NewUploader(cas.UploaderConfig{Source: local, AckTimeout: 10 * time.Second, IdleTimeout: 10 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			b.SetBytes(size)
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				dir := b.TempDir()
				st, err := cas.NewFSStore(cas.FSStoreConfig{Dir: dir})
				if err != nil {
					b.Fatal(err)
				}
				remote.p.Store(st)
				b.StartTimer()
				if err := up.Upload(ctx, ac, lease, ref); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if s, err := st.Stat(ref); err != nil || !s.Complete {
					b.Fatalf("daemon store after Verified: %+v %v", s, err)
				}
				_ = os.RemoveAll(dir) // 32 MiB per op
				b.StartTimer()
			}
			b.StopTimer()
			if s := up.Stats(); s.Verified != int64(b.N) || s.Probes != 0 {
				b.Fatalf("uploader stats %+v after %d uploads", s, b.N)
			}
		})
	}
}

// benchStore is the daemon's store, replaced by a fresh one per upload so
// no upload is deduplicated.
type benchStore struct{ p atomic.Pointer[cas.FSStore] }

func (s *benchStore) Stat(ref wire.CasObjectRef) (cas.Status, error) { return s.p.Load().Stat(ref) }

func (s *benchStore) Open(ref wire.CasObjectRef, off uint64) (io.ReadCloser, error) {
	return s.p.Load().Open(ref, off)
}

func (s *benchStore) Create(ref wire.CasObjectRef) (cas.PartialObject, error) {
	return s.p.Load().Create(ref)
}
