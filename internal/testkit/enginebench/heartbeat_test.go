package enginebench

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
)

// Heartbeat benchmark parameters: hbAgents idle agents heartbeating every
// hbInterval (640 heartbeats/s, under the daemon's default budget of
// 1,000/s and each connection's HeartbeatRate of 20/s), measured over
// hbWindow after hbWarmup.
const (
	hbAgents   = maxAgents
	hbInterval = 100 * time.Millisecond
	hbWarmup   = 500 * time.Millisecond
	hbWindow   = 3 * time.Second
	// hbEchoSize is the raw baseline's request and answer: about a
	// HeartbeatV1 in its envelope and frame, and its HeartbeatAckV1.
	hbEchoSize = 64
)

// BenchmarkHeartbeatCPU measures what keeping an idle agent costs (issue
// 26 item 2): the process's CPU time (user+system; daemon and agents live
// in this process, so both ends) per heartbeat while hbAgents agents over
// real QUIC heartbeat every hbInterval and do nothing else, beside the same
// number of raw connections of the same backend (backends/quic raw
// streams, one bidirectional stream each) echoing hbEchoSize bytes at the
// same rate in the same run. "ours" includes everything an idle agent
// costs in that time (heartbeat encode, decode, the daemon's liveness and
// inventory bookkeeping, timers, acknowledgements), since that is the
// steady cost; cpu-µs/hb is the figure to compare with cpu-µs/echo.
//
//	go test ./internal/testkit/enginebench -run '^$' -bench HeartbeatCPU -benchtime 1x -count 6
func BenchmarkHeartbeatCPU(b *testing.B) {
	b.Run("raw", func(b *testing.B) {
		var total time.Duration
		var echoes int64
		for range b.N {
			cpu, n := rawEchoes(b)
			total += cpu
			echoes += n
		}
		b.ReportMetric(float64(total.Microseconds())/float64(max(echoes, 1)), "cpu-µs/echo")
		b.ReportMetric(float64(echoes)/float64(b.N)/hbWindow.Seconds(), "echo/s")
		b.ReportMetric(0, "ns/op")
	})
	b.Run("ours", func(b *testing.B) {
		var total time.Duration
		var beats int64
		for range b.N {
			cpu, n := ourHeartbeats(b)
			total += cpu
			beats += n
		}
		b.ReportMetric(float64(total.Microseconds())/float64(max(beats, 1)), "cpu-µs/hb")
		b.ReportMetric(float64(beats)/float64(b.N)/hbWindow.Seconds(), "hb/s")
		b.ReportMetric(0, "ns/op")
	})
}

// ourHeartbeats runs hbAgents agents against a daemon over QUIC and
// returns the CPU spent and the heartbeats acknowledged in hbWindow.
func ourHeartbeats(b *testing.B) (time.Duration, int64) {
	au, err := authority.OpenSQLite(context.Background(), ":memory:")
	if err != nil {
		b.Fatal(err)
	}
	defer au.Close()
	d, err := daemon.New(daemon.Config{Authority: au, Timing: daemon.Timing{HeartbeatInterval: hbInterval}})
	if err != nil {
		b.Fatal(err)
	}
	be := backends[1] // quic
	ln, addr := be.listen(b, serverTLS(b))
	served := make(chan struct{})
	go func() { defer close(served); _ = d.Serve(context.Background(), ln) }()
	ctx, cancel := context.WithCancel(context.Background())
	connected := make(chan struct{}, hbAgents)
	var agents []*agent.Agent
	var wg sync.WaitGroup
	idle := agent.ExecutorFunc(func(context.Context, agent.Job, agent.Output) agent.Result { return agent.Result{} })
	for i := range hbAgents {
		cred := credential(b, i)
		var once sync.Once
		a, err := agent.New(agent.Config{Runner: cred.Runner, Signer: cred.Signer, CertChain: cred.CertChain,
			Endpoints: []agent.Endpoint{{Address: addr, Dialer: be.dialer(cred.Client), Backend: be.name}},
			Executor:  idle, Version: "enginebench",
			Hooks: agent.Hooks{OnConnected: func(agent.Status) { once.Do(func() { connected <- struct{}{} }) }}})
		if err != nil {
			b.Fatal(err)
		}
		agents = append(agents, a)
		wg.Add(1)
		go func() { defer wg.Done(); _ = a.Run(ctx) }()
	}
	defer func() {
		cancel()
		wg.Wait()
		for _, a := range agents {
			a.Close()
		}
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		_ = d.Shutdown(sctx)
		_ = ln.Close()
		<-served
	}()
	for range hbAgents {
		select {
		case <-connected:
		case <-time.After(30 * time.Second):
			b.Fatal("agents did not connect")
		}
	}
	acked := func() (n int64) {
		for _, a := range agents {
			n += a.Stats().HeartbeatsAcked
		}
		return n
	}
	time.Sleep(hbWarmup) // let registration's aftermath (inventory, first heartbeats) pass
	b.ResetTimer()
	n0, c0 := acked(), cpuTime()
	time.Sleep(hbWindow) // the measurement interval itself
	c1, n1 := cpuTime(), acked()
	b.StopTimer()
	return c1 - c0, n1 - n0
}

// rawEchoes holds hbAgents raw QUIC connections, each echoing hbEchoSize
// bytes every hbInterval on one stream, and returns the CPU spent and the
// echoes completed in hbWindow.
func rawEchoes(b *testing.B) (time.Duration, int64) {
	ln, err := quic.Listen("127.0.0.1:0", serverTLS(b), quic.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var echoes atomic.Int64
	var wg sync.WaitGroup
	var conns []semantics.BackendConn
	for i := range hbAgents {
		c, err := quic.Dialer{TLS: credential(b, i).Client}.Dial(ctx, ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		s, err := ln.Accept(ctx)
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c, s)
		cs, err := c.OpenStream(ctx)
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(2)
		go func() { // server: echo until the stream ends
			defer wg.Done()
			ss, err := s.AcceptStream(ctx)
			if err != nil {
				return
			}
			buf := make([]byte, hbEchoSize)
			for {
				if _, err := io.ReadFull(ss, buf); err != nil {
					return
				}
				if _, err := ss.Write(buf); err != nil {
					return
				}
			}
		}()
		go func() { // client: one echo per interval
			defer wg.Done()
			buf := make([]byte, hbEchoSize)
			t := time.NewTicker(hbInterval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				if _, err := cs.Write(buf); err != nil {
					return
				}
				if _, err := io.ReadFull(cs, buf); err != nil {
					return
				}
				echoes.Add(1)
			}
		}()
	}
	defer func() {
		cancel()
		for _, c := range conns {
			_ = c.CloseWithCode(wire.CloseNormal, "")
		}
		wg.Wait()
	}()
	time.Sleep(hbWarmup)
	b.ResetTimer()
	n0, c0 := echoes.Load(), cpuTime()
	time.Sleep(hbWindow) // the measurement interval itself
	c1, n1 := cpuTime(), echoes.Load()
	b.StopTimer()
	return c1 - c0, n1 - n0
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
