package quic

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// Session resumption cost (issue 25 item 4, docs/perf.md "Session
// resumption"): the daemon's CPU per full mTLS handshake against a
// resumed one.
//
// BenchmarkServerHandshakeCPU drives crypto/tls's QUIC handshake (what
// quic-go runs) in memory and times only the server's calls, so
// server-ns/op is the daemon's TLS work per handshake (wall time of its
// calls; close to its CPU on an idle machine, inflated by preemption on a
// loaded one), cpu-ns/op the process's CPU per handshake, agent and daemon
// together (getrusage; immune to preemption). On a full handshake the
// daemon pays its CertificateVerify signature and the verification of the agent's
// chain and signature, on a resumed one the ticket's decryption and the
// PSK-(EC)DHE exchange. BenchmarkHandshakeResumption is the same over
// this backend's sockets on loopback (agent and daemon in one process:
// ns/op is one handshake's latency, both sides included).

// quicHandshake runs one handshake between fresh server and client
// connections and returns the time spent in the server's calls.
func quicHandshake(tb testing.TB, stc, ctc *tls.Config) (server time.Duration, resumed bool) {
	ctx := context.Background()
	s := tls.QUICServer(&tls.QUICConfig{TLSConfig: stc})
	c := tls.QUICClient(&tls.QUICConfig{TLSConfig: ctc})
	defer s.Close()
	defer c.Close()
	c.SetTransportParameters(nil)
	if err := c.Start(ctx); err != nil {
		tb.Fatal(err)
	}
	t0 := time.Now()
	if err := s.Start(ctx); err != nil {
		tb.Fatal(err)
	}
	server += time.Since(t0)
	sDone, cDone := false, false
	// pump moves from's output to to; the server's calls are timed.
	pump := func(from, to *tls.QUICConn, toServer bool, done *bool) bool {
		moved := false
		for {
			var t1 time.Time
			if !toServer {
				t1 = time.Now()
			}
			ev := from.NextEvent()
			if !toServer {
				server += time.Since(t1)
			}
			switch ev.Kind {
			case tls.QUICNoEvent:
				return moved
			case tls.QUICTransportParametersRequired:
				from.SetTransportParameters(nil)
			case tls.QUICHandshakeDone:
				*done = true
			case tls.QUICWriteData:
				moved = true
				t2 := time.Now()
				if err := to.HandleData(ev.Level, ev.Data); err != nil {
					tb.Fatal(err)
				}
				if toServer {
					server += time.Since(t2)
				}
			}
		}
	}
	for i := 0; i < 32 && !(sDone && cDone); i++ {
		a := pump(c, s, true, &cDone)
		b := pump(s, c, false, &sDone)
		if !a && !b && !(sDone && cDone) {
			tb.Fatal("handshake stalled")
		}
	}
	if !sDone || !cDone {
		tb.Fatal("handshake did not complete")
	}
	// The ticket the daemon sends after the handshake (quic-go does the
	// same), delivered to the agent's cache.
	t3 := time.Now()
	if err := s.SendSessionTicket(tls.QUICSessionTicketOptions{}); err != nil {
		tb.Fatal(err)
	}
	server += time.Since(t3)
	pump(s, c, false, &sDone)
	return server, c.ConnectionState().DidResume && s.ConnectionState().DidResume
}

func BenchmarkServerHandshakeCPU(b *testing.B) {
	pki := trusttest.NewPKI(b)
	for _, bc := range []struct {
		name, mode string
		curves     []tls.CurveID
	}{
		{"full", "full", nil}, {"resumed", "resumed", nil}, // Go's default: X25519MLKEM768 first
		{"full-x25519", "full", []tls.CurveID{tls.X25519}}, {"resumed-x25519", "resumed", []tls.CurveID{tls.X25519}}, // tls.curves = ["x25519"]
	} {
		mode := bc.mode
		b.Run(bc.name, func(b *testing.B) {
			stc := pki.ServerConfig(b, serverName)
			stc.NextProtos = []string{ALPN}
			stc.CurvePreferences = bc.curves
			ctc := pki.ClientConfig(b, wire.NewRunnerId(), serverName)
			ctc.NextProtos = []string{ALPN}
			ctc.CurvePreferences = bc.curves
			ctc.ClientSessionCache = tls.NewLRUClientSessionCache(4)
			if _, res := quicHandshake(b, stc, ctc); res {
				b.Fatal("the first handshake resumed")
			}
			if mode == "full" {
				ctc.ClientSessionCache = nil
			}
			var server time.Duration
			b.ResetTimer()
			cpu0 := cpuTime()
			for i := 0; i < b.N; i++ {
				d, res := quicHandshake(b, stc, ctc)
				if res != (mode == "resumed") {
					b.Fatalf("resumed %v in mode %s", res, mode)
				}
				server += d
			}
			cpu := cpuTime() - cpu0
			b.ReportMetric(float64(server.Nanoseconds())/float64(b.N), "server-ns/op")
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

func BenchmarkHandshakeResumption(b *testing.B) {
	pki := trusttest.NewPKI(b)
	ln, err := Listen("127.0.0.1:0", pki.ServerConfig(b, serverName), Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ln.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	go func() {
		for {
			c, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			go func() { <-c.Context().Done() }()
		}
	}()
	for _, mode := range []string{"full", "resumed"} {
		b.Run(mode, func(b *testing.B) {
			ctc := pki.ClientConfig(b, wire.NewRunnerId(), serverName)
			stored := make(chan struct{}, 4)
			if mode == "resumed" {
				ctc.ClientSessionCache = trusttest.NotifyingCache{ClientSessionCache: tls.NewLRUClientSessionCache(4), Stored: stored}
			}
			d := Dialer{TLS: ctc}
			dial := func() bool {
				c, err := d.Dial(ctx, ln.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				res := c.ConnectionState().DidResume
				if mode == "resumed" {
					// The connection's new ticket, before closing it (not
					// timed).
					b.StopTimer()
					select {
					case <-stored:
					case <-time.After(5 * time.Second):
						b.Fatal("no session ticket arrived")
					}
					b.StartTimer()
				}
				_ = c.CloseWithCode(wire.CloseNormal, "")
				return res
			}
			dial()
			b.ResetTimer()
			resumed := 0
			for i := 0; i < b.N; i++ {
				if dial() {
					resumed++
				}
			}
			b.StopTimer()
			if mode == "resumed" && resumed != b.N {
				b.Fatalf("only %d of %d handshakes resumed", resumed, b.N)
			}
			b.ReportMetric(float64(resumed)/float64(b.N), "resumed/op")
		})
	}
}
