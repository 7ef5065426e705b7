package daemon_test

import (
	"context"
	"crypto"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/session"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/postcard"
	"forgeyard.dev/transport/wire/registry"
)

// Session fuzzer ops: each input is a sequence of (op, args…) bytes.
const (
	opRawFrame  = iota // a frame of n input bytes (length-prefixed)
	opRawBytes         // n input bytes with no framing
	opHello            // a TransportHelloV1 (role, version range from input)
	opRegister         // RegisterAgentV1 with a valid key proof (after a hello) or a forged one
	opResync           // AgentResyncV1 for the registered session
	opSample           // an envelope around a registry sample, optionally with one byte flipped
	opHeartbeat        // HeartbeatV1 with a seq from input
	opStream           // another stream: kind byte, n input bytes, closed
	numOps
)

var fuzzDigest = wire.CapabilityDigest{Digest: wire.Digest{9}}

const (
	maxFuzzOps      = 64
	fuzzHeapCeiling = 512 << 20 // bounded memory: the live heap stays below this
)

// sessionFuzz is one daemon on the memory backend shared by a fuzz
// process's inputs.
type sessionFuzz struct {
	d       *daemon.Daemon
	dialer  *memory.Dialer
	addr    string
	runner  wire.RunnerId
	signer  crypto.Signer
	chain   [][]byte
	samples []wire.Message
	inputs  atomic.Int64
}

func newSessionFuzz(f testing.TB) *sessionFuzz {
	auth, err := authority.OpenSQLite(context.Background(), ":memory:")
	if err != nil {
		f.Fatal(err)
	}
	pki := trusttest.NewPKI(f)
	n := memory.NewNetwork()
	l, err := n.Listen("fuzz-daemon", pki.ServerConfig(f, "localhost"))
	if err != nil {
		f.Fatal(err)
	}
	tm := enginetest.FastTiming()
	tm.RegistrationTimeout = 500 * time.Millisecond
	d, err := daemon.New(daemon.Config{Authority: auth, RunnerCAs: pki.CAPool(), Timing: tm, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = d.Serve(context.Background(), l) }()
	f.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = d.Shutdown(ctx)
		<-served
		_ = l.Close()
		_ = auth.Close()
	})
	runner := wire.NewRunnerId()
	cert := pki.IssueClient(f, runner, trusttest.LeafOptions{})
	fz := &sessionFuzz{d: d, addr: "fuzz-daemon", runner: runner, signer: cert.PrivateKey.(crypto.Signer), chain: cert.Certificate,
		dialer: &memory.Dialer{Network: n, TLSConfig: pki.ClientConfigWith(f, cert, "localhost")}, samples: registry.Samples()}
	// Warm up: once a connection was served, every long-lived goroutine of
	// the daemon and its accept loop exists, so per-input goroutine counts
	// compare like with like.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	bc, err := fz.dialer.Dial(ctx, fz.addr)
	if err != nil {
		f.Fatal(err)
	}
	for len(d.Sessions()) == 0 && ctx.Err() == nil {
		time.Sleep(time.Millisecond) // no event marks the accept
	}
	_ = bc.CloseWithCode(wire.CloseNormal, "warm-up")
	for len(d.Sessions()) != 0 && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	if ctx.Err() != nil {
		f.Fatal("warm-up connection was not served")
	}
	return fz
}

// fuzzInput reads op arguments from the input; past its end it yields 0.
type fuzzInput struct {
	b []byte
	i int
}

func (in *fuzzInput) more() bool { return in.i < len(in.b) }

func (in *fuzzInput) byte() byte {
	if in.i >= len(in.b) {
		return 0
	}
	in.i++
	return in.b[in.i-1]
}

func (in *fuzzInput) bytes(n int) []byte {
	n = min(n, len(in.b)-in.i)
	p := in.b[in.i : in.i+n]
	in.i += n
	return p
}

// fuzzClient is the hand-driven peer of one input.
type fuzzClient struct {
	sc      *semantics.Conn
	st      *semantics.Stream
	wmu     sync.Mutex
	ack     atomic.Pointer[agentwire.HelloAckV1]
	answers chan wire.MessageId // correlation ids of answers
	readEnd chan struct{}
	proto   wire.ProtocolVersion
	session wire.AgentSessionId
	epoch   uint64
	budget  time.Duration // what the op loop's awaits may still wait in total
}

func (c *fuzzClient) write(p []byte) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.st.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.st.Write(p)
}

func (c *fuzzClient) send(m wire.Message, flip int) wire.MessageId {
	id := wire.NewMessageId()
	env := &wire.Envelope{Protocol: c.proto, MessageID: id, Payload: m}
	body := env.AppendPostcard(nil)
	if flip > 0 {
		body[flip%len(body)] ^= byte(flip >> 8)
	}
	c.write(postcard.AppendUvarint(nil, uint64(len(body))))
	c.write(body)
	return id
}

func (c *fuzzClient) readLoop() {
	defer close(c.readEnd)
	for {
		b, err := c.st.ReadFrame()
		if err != nil {
			return
		}
		env, err := wire.DecodeEnvelope(b, registry.Default)
		if err != nil {
			continue
		}
		if a, ok := env.Payload.(*agentwire.HelloAckV1); ok {
			c.ack.Store(a)
		}
		if a, ok := env.Payload.(*agentwire.RegistrationAcceptedV1); ok {
			c.epoch = a.Epoch // read only by the op loop after the answer arrived
		}
		if env.HasCorrelation {
			select {
			case c.answers <- wire.MessageId(env.CorrelationID):
			default:
			}
		}
	}
}

// await waits briefly for the answer to id (or the connection's end),
// within the input's await budget: after broken framing the daemon may
// swallow every later message into one frame, and the input must not then
// wait for each of them.
func (c *fuzzClient) await(id wire.MessageId, d time.Duration) bool {
	d = min(d, c.budget)
	start := time.Now()
	defer func() { c.budget -= time.Since(start) }()
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case got := <-c.answers:
			if got == id {
				return true
			}
		case <-c.sc.Done():
			return false
		case <-t.C:
			return false
		}
	}
}

// projectGoroutines counts the goroutines running this module's code,
// other than the caller: the fuzzing engine's own goroutines come and go
// and are not counted.
func projectGoroutines() (int, string) {
	buf := make([]byte, 4<<20)
	all := string(buf[:runtime.Stack(buf, true)])
	n := 0
	var ours []string
	for i, g := range strings.Split(all, "\n\n") {
		if i == 0 || !strings.Contains(g, "forgeyard.dev/transport/") {
			continue // i == 0: the caller
		}
		n++
		ours = append(ours, g)
	}
	return n, strings.Join(ours, "\n\n")
}

func (fz *sessionFuzz) run(t testing.TB, data []byte) {
	baseG, _ := projectGoroutines()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	bc, err := fz.dialer.Dial(ctx, fz.addr)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	sc, err := semantics.NewConn(bc, semantics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := sc.OpenStream(ctx, wire.StreamControl)
	if err != nil {
		t.Fatalf("control stream: %v", err)
	}
	c := &fuzzClient{sc: sc, st: st, answers: make(chan wire.MessageId, 256), readEnd: make(chan struct{}), proto: wire.Current,
		session: wire.NewAgentSessionId(), budget: time.Second}
	go c.readLoop()
	in := &fuzzInput{b: data}
	for n := 0; n < maxFuzzOps && in.more() && sc.Context().Err() == nil; n++ {
		switch in.byte() % numOps {
		case opRawFrame:
			p := in.bytes(int(in.byte()))
			c.write(append(postcard.AppendUvarint(nil, uint64(len(p))), p...))
		case opRawBytes:
			c.write(in.bytes(int(in.byte()) % 16))
		case opHello:
			role := agentwire.PeerRole(in.byte() % 6)
			vr := wire.Supported
			if b := in.byte(); b&1 == 1 {
				vr = wire.ProtocolRange{Min: wire.V(uint16(b>>6), uint16(b>>1&7)), Max: wire.V(1, uint16(b>>4&3))}
			}
			c.await(c.send(&agentwire.TransportHelloV1{Role: role, Versions: vr, AgentVersion: "fuzz", HasAgentSession: in.byte()&1 == 1, AgentSession: c.session}, 0), 200*time.Millisecond)
		case opRegister:
			var proof []byte
			if a := c.ack.Load(); a != nil && in.byte()&3 != 0 {
				proof, _ = session.SignKeyProof(fz.signer, a.Challenge, a.TransportSession, c.session)
			} else {
				proof = in.bytes(int(in.byte()))
			}
			c.await(c.send(&agentwire.RegisterAgentV1{Runner: fz.runner, Session: c.session, AgentVersion: "fuzz",
				Capabilities: agentwire.RunnerCapabilitiesV1{OS: "linux", Arch: "amd64", MaxParallel: 1}, CapabilityDigest: fuzzDigest,
				KeyProof: proof, CertChain: fz.chain}, 0), 200*time.Millisecond)
		case opResync:
			c.await(c.send(&agentwire.AgentResyncV1{Session: c.session, Epoch: c.epoch, CapabilityDigest: fuzzDigest}, 0), 200*time.Millisecond)
		case opSample:
			m := fz.samples[int(in.byte())%len(fz.samples)]
			flip := 0
			if b := in.byte(); b&1 == 1 {
				flip = int(in.byte())<<8 | int(b)
			}
			c.await(c.send(m, flip), 50*time.Millisecond)
		case opHeartbeat:
			c.send(&agentwire.HeartbeatV1{Runner: fz.runner, Session: c.session, Seq: uint64(in.byte()), CapabilityDigest: fuzzDigest}, 0)
		case opStream:
			kind := wire.StreamKind(in.byte() % (wire.NumStreamKinds + 1))
			p := in.bytes(int(in.byte()))
			sctx, scancel := context.WithTimeout(ctx, 100*time.Millisecond)
			if kind.Valid() && semantics.KindAllowsUni(kind) && len(p)%2 == 0 {
				if s, err := sc.OpenUniStream(sctx, kind); err == nil {
					_ = s.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
					_, _ = s.Write(p)
					_ = s.Close()
				}
			} else if kind.Valid() && semantics.KindAllowsBidi(kind) {
				if s, err := sc.OpenStream(sctx, kind); err == nil {
					_ = s.SetDeadline(time.Now().Add(100 * time.Millisecond))
					_, _ = s.Write(p)
					_ = s.SendStream.Close()
					_, _ = io.Copy(io.Discard, &s.RecvStream)
				}
			}
			scancel()
		}
	}
	// Keeps working or ends with a defined code: a message the daemon never
	// accepts from an agent must be answered (WireErrorV1), or the
	// connection must close (at the latest after the registration or
	// heartbeat timeout) with a close code this build defines.
	if sc.Context().Err() == nil {
		probe := c.send(&agentwire.HeartbeatAckV1{Seq: 1}, 0)
		c.budget = 5 * time.Second
		if !c.await(probe, 5*time.Second) && sc.Context().Err() == nil {
			select {
			case <-sc.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("connection neither answered a probe nor closed")
			}
		}
	}
	if sc.Context().Err() != nil {
		var ce *semantics.ConnError
		if err := sc.Err(); !errors.As(err, &ce) || !ce.Code.Known() {
			t.Fatalf("connection ended without a defined close code: %v", err)
		}
	}
	_ = bc.CloseWithCode(wire.CloseNormal, "fuzz input done")
	<-c.readEnd
	// No goroutine leak: the daemon forgets the connection and every
	// goroutine of this input ends.
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, stacks := projectGoroutines()
		if len(fz.d.Sessions()) == 0 && n <= baseG {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines %d > %d (sessions %d) after the input:\n%s", n, baseG, len(fz.d.Sessions()), stacks)
		}
		time.Sleep(2 * time.Millisecond) // no event marks the end of a goroutine
	}
	if fz.inputs.Add(1)%64 == 0 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		if ms.HeapAlloc > fuzzHeapCeiling {
			t.Fatalf("live heap %d MiB after %d inputs: unbounded growth", ms.HeapAlloc>>20, fz.inputs.Load())
		}
	}
}

// FuzzSessionFrames feeds arbitrary frame sequences, biased toward valid
// envelopes (hello, a correctly proven registration, resync, heartbeats,
// every registry sample, bit flips of them, raw frames, broken framing,
// extra streams of any kind) to a daemon session over the memory backend.
// Each input must leave no panic, no goroutine behind, a bounded heap, and
// a connection that either still answers or closed with a defined code.
func FuzzSessionFrames(f *testing.F) {
	hello, reg, resync, hb := byte(opHello), byte(opRegister), byte(opResync), byte(opHeartbeat)
	f.Add([]byte{})
	f.Add([]byte{hello, 0, 0, 0})                                                    // hello only
	f.Add([]byte{hello, 0, 0, 1, reg, 1, resync, hb, 1, hb, 2})                      // full join and heartbeats
	f.Add([]byte{hello, 0, 0, 1, reg, 1, resync, opSample, 5, 0, opSample, 9, 1, 3}) // samples, one flipped
	f.Add([]byte{reg, 0, 3, 1, 2, 3})                                                // register before hello
	f.Add([]byte{hello, 3, 0, 0, reg, 0, 4, 9, 9, 9, 9})                             // forged proof
	f.Add([]byte{opRawFrame, 4, 0xff, 0xff, 0xff, 0xff})                             // garbage frame
	f.Add([]byte{opRawBytes, 5, 0xff, 0xff, 0xff, 0xff, 0x0f})                       // oversized length prefix
	f.Add([]byte{hello, 0, 0, 1, reg, 1, resync, opStream, 2, 4, 1, 2, 3, 4})        // a log stream of junk
	f.Add([]byte{hello, 0, 0x81, 0})                                                 // version range below minimum
	for i := range 16 {
		f.Add([]byte{hello, 0, 0, 1, reg, 1, resync, opSample, byte(i * 7), 0, hb, 3})
	}
	fz := newSessionFuzz(f)
	f.Fuzz(func(t *testing.T, data []byte) { fz.run(t, data) })
}
