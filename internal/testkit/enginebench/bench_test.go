package enginebench

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/webtransport"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/agentsetup"
	"forgeyard.dev/transport/internal/stats"
	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// maxAgents is how many agent identities the PKI holds (BenchmarkHeartbeatCPU
// uses them all; the lease benchmarks 8).
const maxAgents = 64

var (
	pkiDir string
	pki    *trust.DevPKI
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "enginebench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pkiDir = filepath.Join(dir, "pki")
	names := make([]string, maxAgents)
	for i := range names {
		names[i] = "a" + strconv.Itoa(i)
	}
	if pki, err = trust.GenerateDevPKI(pkiDir, trust.DevPKIOptions{Agents: names}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	pgtest.StopShared()
	os.RemoveAll(dir)
	os.Exit(code)
}

// backend is a way to listen and dial.
type backend struct {
	name   string
	listen func(tb testing.TB, conf *tls.Config) (semantics.BackendListener, string)
	dialer func(conf *tls.Config) semantics.BackendDialer
}

var memNet = memory.NewNetwork()
var memSeq atomic.Int64

var backends = []backend{
	{"memory", func(tb testing.TB, conf *tls.Config) (semantics.BackendListener, string) {
		addr := fmt.Sprintf("daemon-%d", memSeq.Add(1))
		l, err := memNet.Listen(addr, conf)
		if err != nil {
			tb.Fatal(err)
		}
		return l, addr
	}, func(conf *tls.Config) semantics.BackendDialer {
		return &memory.Dialer{Network: memNet, TLSConfig: conf}
	}},
	{"quic", func(tb testing.TB, conf *tls.Config) (semantics.BackendListener, string) {
		l, err := quic.Listen("127.0.0.1:0", conf, quic.Config{})
		if err != nil {
			tb.Fatal(err)
		}
		return l, l.Addr().String()
	}, func(conf *tls.Config) semantics.BackendDialer { return quic.Dialer{TLS: conf} }},
	{"yamux", func(tb testing.TB, conf *tls.Config) (semantics.BackendListener, string) {
		l, err := yamux.Listen("127.0.0.1:0", conf, yamux.Config{})
		if err != nil {
			tb.Fatal(err)
		}
		return l, l.Addr().String()
	}, func(conf *tls.Config) semantics.BackendDialer { return yamux.Dialer{TLS: conf} }},
	{"webtransport", func(tb testing.TB, conf *tls.Config) (semantics.BackendListener, string) {
		l, err := webtransport.Listen("127.0.0.1:0", conf, webtransport.Config{})
		if err != nil {
			tb.Fatal(err)
		}
		return l, webtransport.URL(l.Addr().String())
	}, func(conf *tls.Config) semantics.BackendDialer { return webtransport.Dialer{TLS: conf} }},
}

func serverTLS(tb testing.TB) *tls.Config {
	c, err := trust.ServerConfig(trust.ServerFiles{CertFile: pki.Server.CertFile, KeyFile: pki.Server.KeyFile, ClientCAFile: pki.CA.CertFile, RequireClientCert: true})
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

func credential(tb testing.TB, i int) *agentsetup.Credential {
	a, _ := pki.Agent("a" + strconv.Itoa(i))
	c, err := agentsetup.LoadCredential(config.ControlPlane{ServerName: "localhost",
		Credential: config.Credential{Certificate: a.CertFile, PrivateKey: a.KeyFile, CA: pki.CA.CertFile}})
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// rig is one daemon and n agents on one backend.
type rig struct {
	d       *daemon.Daemon
	runners []wire.RunnerId
	execEnd sync.Map // attempt → time the executor returned
	acked   chan ackEvent
	stop    func()
}

type ackEvent struct {
	attempt wire.JobAttemptId
	at      time.Time
	ack     agentwire.CompletionAckKind
}

func newRig(tb testing.TB, be backend, au authority.Authority, n, maxParallel int) *rig {
	tb.Helper()
	r := &rig{acked: make(chan ackEvent, 4096)}
	d, err := daemon.New(daemon.Config{Authority: au, RunnerCAs: nil})
	if err != nil {
		tb.Fatal(err)
	}
	r.d = d
	ln, addr := be.listen(tb, serverTLS(tb))
	served := make(chan struct{})
	go func() { defer close(served); _ = d.Serve(context.Background(), ln) }()
	connected := make(chan struct{}, n)
	exec := agent.ExecutorFunc(func(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
		r.execEnd.Store(job.Attempt, time.Now())
		return agent.Result{Kind: agentwire.ResultSucceeded}
	})
	ctx, cancel := context.WithCancel(context.Background())
	var agents []*agent.Agent
	var wg sync.WaitGroup
	for i := range n {
		cred := credential(tb, i)
		var once sync.Once
		a, err := agent.New(agent.Config{Runner: cred.Runner, Signer: cred.Signer, CertChain: cred.CertChain,
			Endpoints: []agent.Endpoint{{Address: addr, Dialer: be.dialer(cred.Client), Backend: be.name}},
			Executor:  exec, MaxParallel: maxParallel, Version: "enginebench",
			Hooks: agent.Hooks{
				OnConnected: func(agent.Status) { once.Do(func() { connected <- struct{}{} }) },
				OnAttemptDone: func(ad agent.AttemptDone) {
					r.acked <- ackEvent{ad.Job.Attempt, time.Now(), ad.Ack}
				},
			}})
		if err != nil {
			tb.Fatal(err)
		}
		agents = append(agents, a)
		r.runners = append(r.runners, cred.Runner)
		wg.Add(1)
		go func() { defer wg.Done(); _ = a.Run(ctx) }()
	}
	r.stop = func() {
		cancel()
		wg.Wait()
		for _, a := range agents {
			a.Close()
		}
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		_ = d.Shutdown(sctx)
		ln.Close()
		<-served
	}
	for range n {
		select {
		case <-connected:
		case <-time.After(10 * time.Second):
			r.stop()
			tb.Fatalf("%s: agents did not connect", be.name)
		}
	}
	return r
}

// offer offers one lease to runner, retrying while the session is not yet
// active or the agent is at capacity.
func (r *rig) offer(tb testing.TB, runner wire.RunnerId, i int) (authority.Lease, time.Duration) {
	var seed [8]byte
	binary.LittleEndian.PutUint64(seed[:], uint64(i))
	spec := wire.JobSpecId{Digest: sha256.Sum256(seed[:])}
	o := daemon.LeaseOffer{Job: wire.NewJobId(), Spec: spec, Payload: wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: spec.Digest, Size: 1}}
	for try := 0; try < 1000; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		l, err := r.d.OfferLease(ctx, runner, o)
		el := time.Since(start)
		cancel()
		if err == nil {
			return l, el
		}
		if err != daemon.ErrNotConnected {
			if _, ok := err.(*daemon.RejectedError); !ok {
				tb.Fatalf("offer: %v", err)
			}
		}
		time.Sleep(time.Millisecond)
	}
	tb.Fatal("offer: agent never available")
	return authority.Lease{}, 0
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// rawRTT measures n 64-byte round trips on a semantics stream of a fresh
// connection on the same backend.
func rawRTT(tb testing.TB, be backend, n int) []time.Duration {
	ln, addr := be.listen(tb, serverTLS(tb))
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type res struct {
		c   *semantics.Conn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		bc, err := ln.Accept(ctx)
		if err != nil {
			acc <- res{nil, err}
			return
		}
		c, err := semantics.NewConn(bc, semantics.Config{})
		acc <- res{c, err}
	}()
	cred := credential(tb, 0)
	bc, err := be.dialer(cred.Client).Dial(ctx, addr)
	if err != nil {
		tb.Fatal(err)
	}
	cc, err := semantics.NewConn(bc, semantics.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	defer cc.CloseWithCode(wire.CloseNormal, "done")
	sr := <-acc
	if sr.err != nil {
		tb.Fatal(sr.err)
	}
	defer sr.c.CloseWithCode(wire.CloseNormal, "done")
	st, err := cc.OpenStream(ctx, wire.StreamControl)
	if err != nil {
		tb.Fatal(err)
	}
	msg := make([]byte, 64)
	if _, err := st.Write(msg); err != nil {
		tb.Fatal(err)
	}
	peer, err := sr.c.AcceptStream(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(peer, buf); err != nil {
				return
			}
			if _, err := peer.Write(buf); err != nil {
				return
			}
		}
	}()
	if _, err := io.ReadFull(st, msg); err != nil { // the first echo
		tb.Fatal(err)
	}
	out := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if _, err := st.Write(msg); err != nil {
			tb.Fatal(err)
		}
		if _, err := io.ReadFull(st, msg); err != nil {
			tb.Fatal(err)
		}
		out = append(out, time.Since(start))
	}
	cc.CloseWithCode(wire.CloseNormal, "done")
	<-done
	return out
}

// BenchmarkLeaseLatency: sequential lease lifecycles, one agent, per
// backend; see the package doc.
func BenchmarkLeaseLatency(b *testing.B) {
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			au, err := authority.OpenSQLite(context.Background(), ":memory:")
			if err != nil {
				b.Fatal(err)
			}
			defer au.Close()
			r := newRig(b, be, au, 1, 1)
			defer r.stop()
			r.offer(b, r.runners[0], -1) // warm up
			<-r.acked
			offers := make([]time.Duration, 0, b.N)
			acks := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				l, el := r.offer(b, r.runners[0], i)
				offers = append(offers, el)
				select {
				case ev := <-r.acked:
					if ev.attempt != l.Attempt || ev.ack != agentwire.AckAccepted {
						b.Fatalf("ack %+v for %v", ev, l.Attempt)
					}
					end, ok := r.execEnd.Load(ev.attempt)
					if !ok {
						b.Fatal("executor did not run")
					}
					acks = append(acks, ev.at.Sub(end.(time.Time)))
				case <-time.After(10 * time.Second):
					b.Fatal("no completion ack")
				}
			}
			b.StopTimer()
			raw := rawRTT(b, be, max(200, min(b.N, 2000)))
			rp50 := stats.PercentileOf(raw, 50)
			b.ReportMetric(us(stats.PercentileOf(offers, 50)), "offer-accept-p50-µs")
			b.ReportMetric(us(stats.PercentileOf(offers, 99)), "offer-accept-p99-µs")
			b.ReportMetric(us(stats.PercentileOf(acks, 50)), "compl-ack-p50-µs")
			b.ReportMetric(us(stats.PercentileOf(acks, 99)), "compl-ack-p99-µs")
			b.ReportMetric(us(rp50), "raw-rtt-p50-µs")
			if rp50 > 0 {
				b.ReportMetric(float64(stats.PercentileOf(offers, 50))/float64(rp50), "offer/rtt")
				b.ReportMetric(float64(stats.PercentileOf(acks, 50))/float64(rp50), "ack/rtt")
			}
		})
	}
}

// BenchmarkCompletionThroughput: completions per second on one daemon with
// 8 agents × 8 slots over memory, SQLite file vs PostgreSQL.
func BenchmarkCompletionThroughput(b *testing.B) {
	stores := []struct {
		name string
		open func(b *testing.B) authority.Authority
	}{
		{"sqlite", func(b *testing.B) authority.Authority {
			au, err := authority.OpenSQLite(context.Background(), filepath.Join(b.TempDir(), "a.db"))
			if err != nil {
				b.Fatal(err)
			}
			return au
		}},
		{"postgres", func(b *testing.B) authority.Authority {
			au, err := authority.OpenPostgres(context.Background(), pgtest.Shared(b).NewDatabase(b))
			if err != nil {
				b.Fatal(err)
			}
			return au
		}},
	}
	const agents, slots = 8, 8
	for _, s := range stores {
		b.Run(s.name, func(b *testing.B) {
			au := s.open(b)
			defer au.Close()
			r := newRig(b, backends[0], au, agents, slots)
			defer r.stop()
			var wg sync.WaitGroup
			sem := make([]chan struct{}, agents)
			for i := range sem {
				sem[i] = make(chan struct{}, slots)
			}
			w := &waiters{m: map[wire.JobAttemptId]chan struct{}{}, early: map[wire.JobAttemptId]bool{}}
			go func() {
				for ev := range r.acked {
					w.fire(ev.attempt)
				}
			}()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				k := i % agents
				sem[k] <- struct{}{}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-sem[k] }()
					l, _ := r.offer(b, r.runners[k], i)
					select {
					case <-w.wait(l.Attempt):
					case <-time.After(30 * time.Second):
						b.Error("no completion ack")
					}
				}()
			}
			wg.Wait()
			el := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/el.Seconds(), "completions/s")
		})
	}
}

// waiters hands out one channel per attempt, closed when its ack arrives
// (also when the ack arrived before anyone waited).
type waiters struct {
	mu    sync.Mutex
	m     map[wire.JobAttemptId]chan struct{}
	early map[wire.JobAttemptId]bool
}

func (w *waiters) wait(a wire.JobAttemptId) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch := make(chan struct{})
	if w.early[a] {
		delete(w.early, a)
		close(ch)
		return ch
	}
	w.m[a] = ch
	return ch
}

func (w *waiters) fire(a wire.JobAttemptId) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ch, ok := w.m[a]; ok {
		close(ch)
		delete(w.m, a)
		return
	}
	w.early[a] = true
}
