package relay_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/webtransport"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/relay"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

const serverName = "localhost"

// env is a relay between agent-side raw connections (yamux or
// WebTransport) and a raw QUIC listener standing in for the daemon.
type env struct {
	t       *testing.T
	pki     *trusttest.PKI
	backend string
	daemon  *quic.Listener
	r       *relay.Relay
	reg     *prometheus.Registry
	ln      semantics.BackendListener
	dialer  semantics.BackendDialer
	cfg     relay.Config
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// upstreamTLS returns the relay's client configuration towards the daemon:
// a certificate of the runner CA that names no runner.
func upstreamTLS(t testing.TB, pki *trusttest.PKI) *relay.Config {
	cert := pki.IssueClient(t, wire.RunnerId{}, trusttest.LeafOptions{OmitRunnerURI: true, CommonName: "forgeyard-relay"})
	return &relay.Config{UpstreamTLS: pki.ClientConfigWith(t, cert, serverName)}
}

// agentListener opens the relay's agent-facing listener of backend.
func agentListener(t testing.TB, pki *trusttest.PKI, backend string) (semantics.BackendListener, semantics.BackendDialer) {
	t.Helper()
	var ln semantics.BackendListener
	var err error
	switch backend {
	case "yamux":
		// The window forgeyard-relay gives its agent-facing listener
		// (limits.stream_window).
		ln, err = yamux.Listen("127.0.0.1:0", pki.ServerConfig(t, serverName), yamux.Config{MaxStreamWindow: relay.DefaultAgentStreamWindow})
	case "webtransport":
		ln, err = webtransport.Listen("127.0.0.1:0", pki.ServerConfig(t, serverName), webtransport.Config{})
	default:
		t.Fatalf("backend %q", backend)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln, agentDialer(backend, pki.ClientConfig(t, wire.NewRunnerId(), serverName))
}

// agentDialer returns an agent's dialer of backend with tlsConf.
func agentDialer(backend string, tlsConf *tls.Config) semantics.BackendDialer {
	if backend == "yamux" {
		return yamux.Dialer{TLS: tlsConf}
	}
	return webtransport.Dialer{TLS: tlsConf}
}

func newEnv(t *testing.T, backend string, mod func(*relay.Config)) *env {
	t.Helper()
	e := &env{t: t, pki: trusttest.NewPKI(t), backend: backend, reg: prometheus.NewRegistry()}
	var err error
	e.daemon, err = quic.Listen("127.0.0.1:0", e.pki.ServerConfig(t, serverName), quic.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.daemon.Close() })
	cfg := upstreamTLS(t, e.pki)
	cfg.Upstreams = []string{e.daemon.Addr().String()}
	cfg.Registerer = e.reg
	if mod != nil {
		mod(cfg)
	}
	e.cfg = *cfg
	e.r, err = relay.New(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.ln, e.dialer = agentListener(t, e.pki, backend)
	served := make(chan error, 1)
	go func() { served <- e.r.Serve(context.Background(), e.ln) }()
	t.Cleanup(func() {
		if err := e.r.Close(); err != nil {
			t.Errorf("relay Close: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve returned %v after Close, want nil", err)
		}
	})
	return e
}

// agent dials the relay as an agent.
func (e *env) agent() semantics.BackendConn {
	e.t.Helper()
	c, err := e.dialer.Dial(testCtx(e.t), e.ln.Addr().String())
	if err != nil {
		e.t.Fatalf("agent dial: %v", err)
	}
	e.t.Cleanup(func() { _ = c.CloseWithCode(wire.CloseNormal, "") })
	return c
}

// accept returns the next connection the relay opened to the daemon.
func (e *env) accept() semantics.BackendConn {
	e.t.Helper()
	c, err := e.daemon.Accept(testCtx(e.t))
	if err != nil {
		e.t.Fatalf("daemon accept: %v", err)
	}
	e.t.Cleanup(func() { _ = c.CloseWithCode(wire.CloseNormal, "") })
	return c
}

// pair dials an agent and returns it with its upstream connection.
func (e *env) pair() (agent, daemon semantics.BackendConn) {
	a := e.agent()
	return a, e.accept()
}

func header(k wire.StreamKind) []byte {
	return wire.AppendStreamHeaderFrame(nil, wire.StreamHeader{Kind: k, Version: wire.Current})
}

func mustWrite(t testing.TB, w io.Writer, b []byte) {
	t.Helper()
	if _, err := w.Write(b); err != nil {
		t.Fatalf("write: %v", err)
	}
}

func mustRead(t testing.TB, r io.Reader, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(r, got); err != nil {
		t.Fatalf("read %q: %v", want, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %q, want %q", got, want)
	}
}

func mustEOF(t testing.TB, r io.Reader) {
	t.Helper()
	var b [1]byte
	n, err := r.Read(b[:])
	if n != 0 || err != io.EOF {
		t.Fatalf("read after FIN: n=%d err=%v, want io.EOF", n, err)
	}
}

// closeCause waits for c to close and returns its *ConnError.
func closeCause(t testing.TB, c semantics.BackendConn) *semantics.ConnError {
	t.Helper()
	select {
	case <-c.Context().Done():
	case <-time.After(15 * time.Second):
		t.Fatal("connection did not close")
	}
	var ce *semantics.ConnError
	if !errors.As(context.Cause(c.Context()), &ce) {
		t.Fatalf("close cause %v is not a *ConnError", context.Cause(c.Context()))
	}
	return ce
}

func streamErr(t testing.TB, err error) *semantics.StreamError {
	t.Helper()
	var se *semantics.StreamError
	if !errors.As(err, &se) {
		t.Fatalf("error %v is not a *StreamError", err)
	}
	return se
}

func backends(t *testing.T, f func(t *testing.T, backend string)) {
	for _, b := range []string{"yamux", "webtransport"} {
		t.Run(b, func(t *testing.T) { f(t, b) })
	}
}

// TestStreamsBothWays: bidi and uni streams opened by either side arrive
// with their header bytes unchanged, data flows both ways, and a FIN on one
// half reaches the other side while the other half stays open.
func TestStreamsBothWays(t *testing.T) {
	backends(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, nil)
		ctx := testCtx(t)
		a, d := e.pair()

		// Agent-opened bidi control stream, half-closed by the daemon first.
		as, err := a.OpenStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustWrite(t, as, append(header(wire.StreamControl), "ping"...))
		ds, err := d.AcceptStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustRead(t, ds, append(header(wire.StreamControl), "ping"...))
		mustWrite(t, ds, []byte("pong"))
		if err := ds.Close(); err != nil {
			t.Fatal(err)
		}
		mustRead(t, as, []byte("pong"))
		mustEOF(t, as)
		mustWrite(t, as, []byte("still open")) // the agent's half is still open
		mustRead(t, ds, []byte("still open"))
		_ = as.Close()
		mustEOF(t, ds)

		// Daemon-opened uni log stream.
		du, err := d.OpenUniStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		payload := bytes.Repeat([]byte("log line\n"), 50000) // 450 kB: many copy buffers
		go func() {
			_, _ = du.Write(append(header(wire.StreamLog), payload...))
			_ = du.Close()
		}()
		au, err := a.AcceptUniStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(au)
		if err != nil {
			t.Fatal(err)
		}
		if want := append(header(wire.StreamLog), payload...); !bytes.Equal(got, want) {
			t.Fatalf("uni stream: got %d bytes, want %d (equal prefix: %v)", len(got), len(want), bytes.HasPrefix(want, got))
		}

		// Agent-opened uni CAS upload and daemon-opened bidi stream.
		au2, err := a.OpenUniStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustWrite(t, au2, append(header(wire.StreamCasUpload), "object"...))
		_ = au2.Close()
		du2, err := d.AcceptUniStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustRead(t, du2, append(header(wire.StreamCasUpload), "object"...))
		mustEOF(t, du2)

		db, err := d.OpenStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustWrite(t, db, append(header(wire.StreamDiagnostic), "probe"...))
		ab, err := a.AcceptStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustRead(t, ab, append(header(wire.StreamDiagnostic), "probe"...))
		mustWrite(t, ab, []byte("answer"))
		mustRead(t, db, []byte("answer"))

		st := e.r.Stats()
		if st.Streams != 4 || st.BytesToAgent < int64(len(payload)) || st.BytesToDaemon < 10 {
			t.Fatalf("stats %+v", st)
		}
		if v := testutil.ToFloat64(mustCounter(t, e.reg, "forgeyard_relay_bytes_total", map[string]string{"backend": backend, "direction": "to_agent"})); v < float64(len(payload)) {
			t.Fatalf("forgeyard_relay_bytes_total{to_agent} = %v", v)
		}
	})
}

// mustCounter finds one sample of a registered metric family.
func mustCounter(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			v := m.GetCounter().GetValue()
			if m.GetGauge() != nil {
				v = m.GetGauge().GetValue()
			}
			c := prometheus.NewCounter(prometheus.CounterOpts{Name: "sample"})
			c.Add(v)
			return c
		}
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return nil
}

// TestCloseCodes: a close code and reason reach the other side unchanged,
// in both directions.
func TestCloseCodes(t *testing.T) {
	backends(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, nil)
		t.Run("daemon to agent", func(t *testing.T) {
			a, d := e.pair()
			_ = d.CloseWithCode(wire.CloseRunnerDisabled, "runner disabled by operator")
			ce := closeCause(t, a)
			if ce.Code != wire.CloseRunnerDisabled || ce.Reason != "runner disabled by operator" || !ce.Remote {
				t.Fatalf("agent saw %+v", ce)
			}
		})
		t.Run("daemon draining", func(t *testing.T) {
			a, d := e.pair()
			_ = d.CloseWithCode(wire.CloseShutdown, "daemon draining")
			if ce := closeCause(t, a); ce.Code != wire.CloseShutdown || ce.Reason != "daemon draining" {
				t.Fatalf("agent saw %+v", ce)
			}
		})
		t.Run("agent to daemon", func(t *testing.T) {
			a, d := e.pair()
			_ = a.CloseWithCode(wire.CloseSessionFenced, "agent says fenced")
			ce := closeCause(t, d)
			if ce.Code != wire.CloseSessionFenced || ce.Reason != "agent says fenced" || !ce.Remote {
				t.Fatalf("daemon saw %+v", ce)
			}
		})
		t.Run("data before close arrives", func(t *testing.T) {
			ctx := testCtx(t)
			a, d := e.pair()
			as, _ := a.OpenStream(ctx)
			mustWrite(t, as, header(wire.StreamControl))
			ds, err := d.AcceptStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			mustRead(t, ds, header(wire.StreamControl))
			mustWrite(t, ds, []byte("goaway"))
			mustRead(t, as, []byte("goaway")) // then the daemon closes
			_ = d.CloseWithCode(wire.CloseShutdown, "bye")
			if ce := closeCause(t, a); ce.Code != wire.CloseShutdown {
				t.Fatalf("agent saw %+v", ce)
			}
		})
	})
}

// TestStreamResets: RESET_STREAM and STOP_SENDING codes cross the relay.
func TestStreamResets(t *testing.T) {
	backends(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, nil)
		ctx := testCtx(t)
		a, d := e.pair()

		// The agent resets its send half: the daemon's read fails with the code.
		as, _ := a.OpenStream(ctx)
		mustWrite(t, as, append(header(wire.StreamCasUpload), "partial"...))
		ds, err := d.AcceptStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustRead(t, ds, append(header(wire.StreamCasUpload), "partial"...))
		as.CancelWrite(semantics.StreamForbidden)
		_, err = io.ReadAll(ds)
		if se := streamErr(t, err); se.Code != semantics.StreamForbidden || !se.Remote {
			t.Fatalf("daemon read: %+v", se)
		}
		// The daemon resets its send half: the agent's read fails with the code.
		ds.CancelWrite(semantics.StreamShutdown)
		_, err = io.ReadAll(as)
		if se := streamErr(t, err); se.Code != semantics.StreamShutdown || !se.Remote {
			t.Fatalf("agent read: %+v", se)
		}

		// The daemon stops a uni stream the agent keeps writing to
		// (STOP_SENDING): the agent's writes fail with the daemon's code.
		au, _ := a.OpenUniStream(ctx)
		mustWrite(t, au, header(wire.StreamLog))
		du, err := d.AcceptUniStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustRead(t, du, header(wire.StreamLog))
		du.CancelRead(semantics.StreamFrameTooLarge)
		chunk := make([]byte, 16<<10)
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, err := au.Write(chunk)
			if err != nil {
				if se := streamErr(t, err); se.Code != semantics.StreamFrameTooLarge || !se.Remote {
					t.Fatalf("agent write: %+v", se)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("agent writes kept succeeding after the daemon's STOP_SENDING")
			}
		}
	})
}

// TestStreamLimit: an agent opening more streams than MaxStreamsPerConn
// has the excess refused (StreamRefused) while its other streams and other
// agents keep working; closing a stream frees its slot.
func TestStreamLimit(t *testing.T) {
	backends(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, func(c *relay.Config) { c.MaxStreamsPerConn = 3 })
		ctx := testCtx(t)
		greedy, gd := e.pair()
		var open, dss []semantics.RawStream
		for range 3 {
			s, err := greedy.OpenStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			mustWrite(t, s, header(wire.StreamControl))
			ds, err := gd.AcceptStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			mustRead(t, ds, header(wire.StreamControl))
			open = append(open, s)
			dss = append(dss, ds)
		}
		extra, err := greedy.OpenStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = extra.Write(header(wire.StreamControl))
		_, err = io.ReadAll(extra)
		if se := streamErr(t, err); se.Code != semantics.StreamRefused {
			t.Fatalf("extra stream: %+v", se)
		}
		if st := e.r.Stats(); st.StreamsRefused != 1 {
			t.Fatalf("StreamsRefused = %d, want 1", st.StreamsRefused)
		}
		// Another agent is unaffected.
		other, od := e.pair()
		os, _ := other.OpenStream(ctx)
		mustWrite(t, os, append(header(wire.StreamControl), "hi"...))
		ods, err := od.AcceptStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustRead(t, ods, append(header(wire.StreamControl), "hi"...))
		// The greedy agent's admitted streams still work, and finishing one
		// frees a slot.
		mustWrite(t, open[0], []byte("x"))
		mustRead(t, dss[0], []byte("x"))
		mustWrite(t, dss[0], []byte("y"))
		mustRead(t, open[0], []byte("y"))
		_ = open[0].Close()
		_ = dss[0].Close()
		mustEOF(t, dss[0])
		mustEOF(t, open[0])
		if err := greedy.Context().Err(); err != nil {
			t.Fatalf("greedy agent's connection closed: %v", context.Cause(greedy.Context()))
		}
		// The slot frees once both directions of the stream ended.
		deadline := time.Now().Add(10 * time.Second)
		for {
			s, err := greedy.OpenStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = s.Write(header(wire.StreamControl)) // refused (and failing) until the slot is free
			acc := make(chan semantics.RawStream, 1)
			actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			go func() {
				ds, err := gd.AcceptStream(actx)
				if err == nil {
					acc <- ds
				}
				close(acc)
			}()
			ds, ok := <-acc
			cancel()
			if ok {
				mustRead(t, ds, header(wire.StreamControl))
				break
			}
			s.CancelWrite(semantics.StreamCancelled)
			s.CancelRead(semantics.StreamCancelled)
			if time.Now().After(deadline) {
				t.Fatal("no slot freed after a stream ended")
			}
		}
	})
}

// TestConnectionLimit: beyond MaxConns agents are closed with
// CloseOverloaded; the admitted agent is unaffected.
func TestConnectionLimit(t *testing.T) {
	backends(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, func(c *relay.Config) { c.MaxConns = 1 })
		ctx := testCtx(t)
		first, d := e.pair()
		// WebTransport's Dial waits for the session, so the refusal can
		// surface there; yamux's returns first.
		var ce *semantics.ConnError
		if second, err := e.dialer.Dial(ctx, e.ln.Addr().String()); err == nil {
			ce = closeCause(t, second)
		} else if !errors.As(err, &ce) {
			t.Fatalf("second agent dial: %v", err)
		}
		if ce.Code != wire.CloseOverloaded || !ce.Remote {
			t.Fatalf("second agent: %+v", ce)
		}
		s, _ := first.OpenUniStream(ctx)
		mustWrite(t, s, append(header(wire.StreamLog), "ok"...))
		ds, err := d.AcceptUniStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustRead(t, ds, append(header(wire.StreamLog), "ok"...))
		if st := e.r.Stats(); st.Refused != 1 || st.Active != 1 {
			t.Fatalf("stats %+v", st)
		}
		// Once the first agent left, its slot is free again.
		_ = first.CloseWithCode(wire.CloseNormal, "done")
		closeCause(t, d)
		deadline := time.Now().Add(10 * time.Second)
		for e.r.Stats().Active != 0 { // no event marks the release; poll
			if time.Now().After(deadline) {
				t.Fatalf("slot not released: %+v", e.r.Stats())
			}
			time.Sleep(5 * time.Millisecond)
		}
		third, td := e.pair()
		if third.Context().Err() != nil || td.Context().Err() != nil {
			t.Fatal("third agent not relayed")
		}
	})
}

// blackhole returns a UDP address that swallows every packet (a daemon
// endpoint behind a firewall that drops UDP silently).
func blackhole(t testing.TB) string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	return pc.LocalAddr().String()
}

// TestUpstreamFailover: the first daemon endpoint drops everything; the
// relay fails over to the second within DialTimeout.
func TestUpstreamFailover(t *testing.T) {
	dead := blackhole(t)
	e := newEnv(t, "yamux", func(c *relay.Config) {
		c.Upstreams = append([]string{dead}, c.Upstreams...)
		c.DialTimeout = 300 * time.Millisecond
	})
	start := time.Now()
	a, d := e.pair()
	_ = a
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Fatalf("connected in %v: the dead endpoint was not tried first", el)
	}
	if d.RemoteAddr() == nil {
		t.Fatal("no upstream")
	}
	if st := e.r.Stats(); st.DialFailures != 1 {
		t.Fatalf("DialFailures = %d, want 1", st.DialFailures)
	}
	if v := testutil.ToFloat64(mustCounter(t, e.reg, "forgeyard_relay_upstream_dial_failures_total", nil)); v != 1 {
		t.Fatalf("forgeyard_relay_upstream_dial_failures_total = %v", v)
	}
}

// TestNoUpstream: with every endpoint dead the agent is closed with
// CloseShutdown (reconnect elsewhere) and a reason naming the problem.
func TestNoUpstream(t *testing.T) {
	e := newEnv(t, "yamux", func(c *relay.Config) {
		c.Upstreams = []string{blackhole(t), blackhole(t)}
		c.DialTimeout = 200 * time.Millisecond
	})
	ce := closeCause(t, e.agent())
	if ce.Code != wire.CloseShutdown || !strings.Contains(ce.Reason, "no daemon endpoint reachable") {
		t.Fatalf("agent saw %+v", ce)
	}
	if st := e.r.Stats(); st.DialFailures != 2 {
		t.Fatalf("DialFailures = %d, want 2", st.DialFailures)
	}
}

// TestShutdown: Shutdown closes both sides with CloseShutdown and makes
// Serve return nil.
func TestShutdown(t *testing.T) {
	e := newEnv(t, "yamux", nil)
	a, d := e.pair()
	if err := e.r.Shutdown(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]semantics.BackendConn{"agent": a, "daemon": d} {
		if ce := closeCause(t, c); ce.Code != wire.CloseShutdown || ce.Reason != "relay shutting down" {
			t.Fatalf("%s saw %+v", name, ce)
		}
	}
	if err := e.r.Serve(context.Background(), e.ln); !errors.Is(err, relay.ErrClosed) {
		t.Fatalf("Serve after Shutdown: %v", err)
	}
}

// TestConfigErrors: New rejects unusable configurations with a message
// naming the field.
func TestConfigErrors(t *testing.T) {
	for _, c := range []struct {
		cfg  relay.Config
		want string
	}{
		{relay.Config{}, "Upstreams is empty"},
		{relay.Config{Upstreams: []string{"127.0.0.1:1"}}, "UpstreamTLS is required"},
		{relay.Config{Upstreams: []string{""}}, "Upstreams[0] is empty"},
		{relay.Config{Upstreams: []string{"x:1"}, MaxConns: -1}, "MaxConns is negative"},
	} {
		if _, err := relay.New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want %q", c.cfg, err, c.want)
		}
	}
}
