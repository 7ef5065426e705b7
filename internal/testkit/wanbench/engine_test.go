package wanbench

import (
	"context"
	"crypto"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/relay"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// startRelay runs a daemon-side QUIC listener (returned) and a relay in
// front of it whose agent-facing listener of backend is what the path
// leads to (its address and network are returned).
func (e *env) startRelay(tb testing.TB, backend string) (daemonLn semantics.BackendListener, agentAddr, network string) {
	tb.Helper()
	dl, err := quic.Listen("127.0.0.1:0", e.pki.ServerConfig(tb, serverName), quic.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = dl.Close() })
	agentAddr, network = e.startRelayTo(tb, backend, dl.Addr().String())
	return dl, agentAddr, network
}

// startRelayTo runs a relay in front of the daemon at upstream.
func (e *env) startRelayTo(tb testing.TB, backend, upstream string) (agentAddr, network string) {
	tb.Helper()
	cert := e.pki.IssueClient(tb, wire.RunnerId{}, trusttest.LeafOptions{OmitRunnerURI: true, CommonName: "forgeyard-relay"})
	r, err := relay.New(relay.Config{Upstreams: []string{upstream}, UpstreamTLS: e.pki.ClientConfigWith(tb, cert, serverName),
		Registerer: prometheus.NewRegistry()})
	if err != nil {
		tb.Fatal(err)
	}
	ln, addr, network := listenOurs(tb, backend, e.pki.ServerConfig(tb, serverName), quic.Config{})
	served := make(chan struct{})
	go func() { defer close(served); _ = r.Serve(context.Background(), ln) }()
	tb.Cleanup(func() { _ = r.Close(); <-served })
	return addr, network
}

// casUpload uploads one object of size bytes from the agent side with
// cas.Uploader; the daemon side hashes every byte and commits only on a
// matching SHA-256. It returns MB/s.
func (e *env) casUpload(tb testing.TB, o *oursImpl, p path, size int) float64 {
	tb.Helper()
	data := make([]byte, size)
	var x uint64 = 0x9e3779b97f4a7c15
	for i := 0; i+8 <= size; i += 8 { // incompressible, deterministic
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(data[i:], x)
	}
	ref := wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: sha256.Sum256(data), Size: uint64(size)}
	local, err := cas.NewFSStore(cas.FSStoreConfig{Dir: tb.TempDir()})
	if err != nil {
		tb.Fatal(err)
	}
	po, err := local.Create(ref)
	if err != nil {
		tb.Fatal(err)
	}
	if err := po.Append(data); err != nil {
		tb.Fatal(err)
	}
	if err := po.Commit(); err != nil {
		tb.Fatal(err)
	}
	remote, err := cas.NewFSStore(cas.FSStoreConfig{Dir: tb.TempDir()})
	if err != nil {
		tb.Fatal(err)
	}
	lease := wire.NewLeaseId()
	allow := cas.AuthorizerFunc(func(_ context.Context, l wire.LeaseId, r wire.CasObjectRef, _ cas.Access) error {
		if l == lease && r == ref {
			return nil
		}
		return cas.ErrForbidden
	})
	ab, db, _, _ := o.backendPair(tb, e, p)
	ac, err := semantics.NewConn(ab, semConfig())
	if err != nil {
		tb.Fatal(err)
	}
	dc, err := semantics.NewConn(db, semConfig())
	if err != nil {
		tb.Fatal(err)
	}
	srv, err := cas.NewServer(cas.ServerConfig{Store: remote, Authorizer: allow, HeaderTimeout: 30 * time.Second, IdleTimeout: 30 * time.Second})
	if err != nil {
		tb.Fatal(err)
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
	defer func() {
		_ = ac.CloseWithCode(wire.CloseNormal, "")
		_ = dc.CloseWithCode(wire.CloseNormal, "")
		handlers.Wait()
	}()
	up, err := cas.NewUploader(cas.UploaderConfig{Source: local, AckTimeout: 60 * time.Second, IdleTimeout: 60 * time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t0 := time.Now()
	if err := up.Upload(ctx, ac, lease, ref); err != nil {
		tb.Fatalf("CAS upload of %d bytes: %v", size, err)
	}
	el := time.Since(t0)
	if s, err := remote.Stat(ref); err != nil || !s.Complete {
		tb.Fatalf("daemon store after Verified: %+v %v", s, err)
	}
	return float64(size) / el.Seconds() / 1e6
}

// register starts a real daemon (SQLite in memory) behind the path (and
// the relay) and measures from agent.Run to its registration being
// acknowledged (agent Hooks.OnConnected).
func (e *env) register(tb testing.TB, o *oursImpl, p path) time.Duration {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	auth, err := authority.OpenSQLite(ctx, ":memory:")
	if err != nil {
		tb.Fatal(err)
	}
	defer auth.Close()
	d, err := daemon.New(daemon.Config{Authority: auth, RunnerCAs: e.pki.CAPool()})
	if err != nil {
		tb.Fatal(err)
	}
	var ln semantics.BackendListener
	var target, network string
	if o.relay {
		ql, err := quic.Listen("127.0.0.1:0", e.pki.ServerConfig(tb, serverName), quic.Config{})
		if err != nil {
			tb.Fatal(err)
		}
		ln = ql
		target, network = e.startRelayTo(tb, o.backend, ql.Addr().String())
	} else {
		ln, target, network = listenOurs(tb, o.backend, e.pki.ServerConfig(tb, serverName), o.quic)
	}
	via := e.proxy(tb, network, target, p)
	served := make(chan struct{})
	go func() { defer close(served); _ = d.Serve(ctx, ln) }()
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		_ = d.Shutdown(sctx)
		_ = ln.Close()
		<-served
	}()
	runner := wire.NewRunnerId()
	tlsConf := e.pki.ClientConfig(tb, runner, serverName)
	cert := tlsConf.Certificates[0]
	connected := make(chan time.Time, 1)
	var once sync.Once
	a, err := agent.New(agent.Config{
		Runner: runner, Signer: cert.PrivateKey.(crypto.Signer), CertChain: cert.Certificate,
		Endpoints: []agent.Endpoint{{Address: dialAddr(o.backend, via), Backend: o.backend, Dialer: dialerOf(o.backend, tlsConf, o.quic)}},
		Executor:  agent.NewSyntheticExecutor(1, agent.SyntheticOptions{}),
		Hooks:     agent.Hooks{OnConnected: func(agent.Status) { once.Do(func() { connected <- time.Now() }) }},
		SpoolDir:  tb.TempDir(),
		Version:   "wanbench",
	})
	if err != nil {
		tb.Fatal(err)
	}
	runErr := make(chan error, 1)
	t0 := time.Now()
	go func() { runErr <- a.Run(ctx) }()
	defer func() {
		_ = a.Close()
		<-runErr
	}()
	select {
	case at := <-connected:
		return at.Sub(t0)
	case err := <-runErr:
		tb.Fatalf("agent Run returned %v before registering", err)
	case <-ctx.Done():
		tb.Fatal("no registration within a minute")
	}
	return 0
}

// --- tables ------------------------------------------------------------------

type oursRow struct {
	res result
	raw string
}

type cellTable struct {
	path path
	raws map[string]result
	ours []oursRow
}

func ms(d time.Duration) string {
	switch {
	case d == 0:
		return "–"
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2f", float64(d.Microseconds())/1e3)
	default:
		return fmt.Sprintf("%.1f", float64(d.Microseconds())/1e3)
	}
}

func ratio(a, b float64) string {
	if b <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f %%", 100*a/b)
}

// verdict checks issue 19's targets for one row: control p99 under one
// bulk stream ≤ RTT + 1 ms (+2 ms at loss; through the relay RTT + 2 ms),
// one-stream bulk ≥ 85 % of raw (≥ 90 % on paths ≥ 50 ms).
func verdict(p path, r oursRow, raw result) string {
	slack := time.Millisecond
	if strings.HasPrefix(r.res.name, "relay+") {
		slack = 2 * time.Millisecond
	}
	if p.loss > 0 {
		slack += 2 * time.Millisecond
	}
	var miss []string
	if r.res.bulk1.p99 > p.rtt+slack {
		miss = append(miss, "p99")
	}
	floor := 0.85
	if p.rtt >= 50*time.Millisecond {
		floor = 0.90
	}
	if raw.bulk1.mbps > 0 && r.res.bulk1.mbps < floor*raw.bulk1.mbps {
		miss = append(miss, "bulk")
	}
	if len(miss) == 0 {
		return "met"
	}
	return "missed: " + strings.Join(miss, ", ")
}

func render(tables []cellTable, e *env, elapsed time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## WAN paths (%s, %d Mbit/s each way, drop-tail queue of one BDP ≥ 10 ms; matrix took %s)\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), e.bw*8/1_000_000, elapsed.Round(time.Second))
	b.WriteString("Times in ms, goodput in MB/s; every cell is ours / the raw library of the same leg, same run, same path.\n")
	b.WriteString("ctl p50/p99 under N bulk: 64-byte control round trips while N daemon→agent bulk streams saturate the path.\n\n")
	b.WriteString("| path (RTT / loss) | backend | raw | connect | idle p50 | 1 bulk: ctl p50 | ctl p99 | bulk MB/s (% raw) | 4 bulk: ctl p99 | bulk MB/s (% raw) | CAS MB/s (% raw 1-stream) | logs MB/s (% raw 1-stream) | register (raw connect) | targets |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, t := range tables {
		for _, r := range t.ours {
			raw := t.raws[r.raw]
			o := r.res
			fmt.Fprintf(&b, "| %s | %s | %s | %s / %s | %s / %s | %s / %s | %s / %s | %.2f / %.2f (%s) | %s / %s | %.2f / %.2f (%s) | %.2f (%s) | %.2f (%s) | %s (%s) | %s |\n",
				t.path, o.name, r.raw,
				ms(o.connect), ms(raw.connect),
				ms(o.idle.p50), ms(raw.idle.p50),
				ms(o.bulk1.p50), ms(raw.bulk1.p50),
				ms(o.bulk1.p99), ms(raw.bulk1.p99),
				o.bulk1.mbps, raw.bulk1.mbps, ratio(o.bulk1.mbps, raw.bulk1.mbps),
				ms(o.bulk4.p99), ms(raw.bulk4.p99),
				o.bulk4.mbps, raw.bulk4.mbps, ratio(o.bulk4.mbps, raw.bulk4.mbps),
				o.cas, ratio(o.cas, raw.bulk1.mbps),
				o.logs, ratio(o.logs, raw.bulk1.mbps),
				ms(o.register), ms(raw.connect),
				verdict(t.path, r, raw))
		}
		if tcp, ok := t.raws["raw TLS/TCP"]; ok {
			fmt.Fprintf(&b, "| %s | (baseline) | raw TLS/TCP, a connection per stream | %s | %s | %s | %s | %.2f | %s | %.2f | – | – | – | – |\n",
				t.path, ms(tcp.connect), ms(tcp.idle.p50), ms(tcp.bulk1.p50), ms(tcp.bulk1.p99), tcp.bulk1.mbps, ms(tcp.bulk4.p99), tcp.bulk4.mbps)
		}
	}
	b.WriteString("\nSamples per p99: at least 10 round trips and as many as fit in the measuring time (FY_WAN_MEASURE); on 100 ms paths that is about 20, so p99 is the maximum.\n")
	return b.String()
}
