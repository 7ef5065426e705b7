// Package netsim provides user-space network impairment proxies for tests
// and the demo (tc netem is not available everywhere): a UDP proxy for QUIC
// and WebTransport and a TCP proxy for TLS+yamux, both listening on
// loopback and forwarding to one target address.
//
// Each direction (Up: client → target, Down: target → client) has its own
// Impairment: added one-way latency and jitter, bandwidth (serialization
// delay) with a bounded bottleneck queue, and random loss. The WAN
// benchmark (internal/testkit/wanbench, `make bench-wan`) builds its emulated paths
// from these.
//
// Loss differs by protocol. A UDP datagram is dropped with probability
// Loss. The TCP proxy terminates TCP on both sides, so it cannot drop a
// segment of the proxied connection; instead each chunk it forwards counts
// as ceil(len/1448) segments, and when one of them is "lost" (probability
// Loss each) the chunk — and, the direction being FIFO, everything behind
// it — is held for LossStall (default: twice Latency, one round trip of a
// symmetric path, i.e. a fast retransmit). This models the head-of-line
// stall a lost segment causes, not the congestion-window cut that follows
// it, so TCP at a given loss rate is flattered (document that beside any
// figure). Likewise TCP's own congestion control runs over loopback to the
// proxy and never sees the emulated round trip: the proxy behaves like a
// split-TCP middlebox whose bottleneck queue (Queue) pushes back.
//
// The controls model path failures:
//
//   - Blackhole(true) silently drops every packet (UDP) or stalls every byte
//     (TCP) until Blackhole(false) or Restore: a path that disappeared.
//     Endpoints notice only through their own timeouts.
//   - Cut severs the current flows. TCP: both sockets of every current
//     connection are reset (RST). UDP: packets of current flows are dropped
//     from now on, so their QUIC connections die by idle timeout exactly as
//     with a failed path, while a redial (a new client source port) passes.
//   - Restore ends a blackhole and forgets cut flows.
//
// Resources are bounded: a proxy runs a fixed number of goroutines plus one
// (UDP) or four (TCP) per flow, flows are capped by Options.MaxFlows, queues
// by Options.QueuePackets, and Close stops everything and waits for it.
// All methods are safe for concurrent use.
package netsim

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Impairment describes one direction of a path. The zero value forwards
// immediately and losslessly.
type Impairment struct {
	// Latency is added to every packet or chunk (one way).
	Latency time.Duration
	// Bandwidth in bytes per second; 0 is unlimited. Data is serialized at
	// this rate before Latency is added.
	Bandwidth int64
	// Loss is the probability (0–1) that a UDP datagram is dropped. For
	// TCP it is the probability per 1448-byte segment of a stall of
	// LossStall (see the package comment).
	Loss float64
	// Jitter adds a uniformly random extra delay in [0, Jitter) to every
	// packet or chunk. Delivery order is kept (a packet never overtakes
	// the one before it), as on a single path.
	Jitter time.Duration
	// Queue bounds the bottleneck queue in front of the Bandwidth
	// serializer, as the time its content takes to serialize: a UDP
	// datagram that would wait longer is dropped (drop-tail), a TCP chunk
	// waits (backpressure). 0 is unbounded (up to Options.QueuePackets).
	// Ignored without Bandwidth.
	Queue time.Duration
	// LossStall is the TCP stall per lost segment (0: 2 × Latency, at
	// least 1 ms).
	LossStall time.Duration
}

// tcpSegment is the segment size TCP loss is drawn for.
const tcpSegment = 1448

// Options configures a proxy. The zero value is usable.
type Options struct {
	// Up applies to client → target traffic, Down to target → client.
	Up, Down Impairment
	// Seed makes loss decisions reproducible (0: seed 1).
	Seed uint64
	// MaxFlows bounds concurrent client flows (UDP source addresses or TCP
	// connections); further ones are refused (0: 64).
	MaxFlows int
	// QueuePackets bounds the packets or chunks queued per direction
	// waiting for their delivery time; a full queue drops (UDP) or
	// applies backpressure (TCP) (0: 4096).
	QueuePackets int
	// FlowIdleTimeout forgets a UDP flow after this long without traffic
	// (0: 2 minutes).
	FlowIdleTimeout time.Duration
	// TCPReadBuffer, when positive, sets SO_RCVBUF of both sockets the TCP
	// proxy reads from, so that the bytes a sender can push ahead into the
	// proxy's kernel buffer (queueing the Impairment does not see) stay
	// small; on Linux it also caps the MSS towards the proxy at 1448 bytes
	// (loopback's 64 KiB segments would not fit a small buffer). 0 keeps
	// the kernel's auto-tuned buffer and loopback's MSS.
	TCPReadBuffer int
}

func (o *Options) defaults() {
	if o.MaxFlows <= 0 {
		o.MaxFlows = 64
	}
	if o.QueuePackets <= 0 {
		o.QueuePackets = 4096
	}
	if o.FlowIdleTimeout <= 0 {
		o.FlowIdleTimeout = 2 * time.Minute
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
}

// ErrClosed is returned by operations on a closed proxy.
var ErrClosed = errors.New("netsim: proxy closed")

// Stats are cumulative counters of a proxy.
type Stats struct {
	// Flows is the number of flows (UDP source addresses or TCP connections)
	// ever accepted; Refused counts flows over MaxFlows.
	Flows, Refused uint64
	// UpBytes/DownBytes were delivered; UpDropped/DownDropped are packets
	// (UDP) or chunks (TCP) dropped by loss, blackhole, cut or a full queue.
	UpBytes, DownBytes     uint64
	UpDropped, DownDropped uint64
	// Cuts counts Cut calls that severed at least one flow.
	Cuts uint64
}

type counters struct {
	flows, refused, upBytes, downBytes, upDropped, downDropped, cuts atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		Flows: c.flows.Load(), Refused: c.refused.Load(),
		UpBytes: c.upBytes.Load(), DownBytes: c.downBytes.Load(),
		UpDropped: c.upDropped.Load(), DownDropped: c.downDropped.Load(),
		Cuts: c.cuts.Load(),
	}
}

// shaper computes delivery times for one direction.
type shaper struct {
	mu   sync.Mutex
	imp  Impairment
	next time.Time // when the serializer is free (bandwidth)
	last time.Time // latest delivery time handed out (jitter keeps order)
	rng  *rand.Rand
}

func newShaper(imp Impairment, seed uint64) *shaper {
	return &shaper{imp: imp, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func (s *shaper) set(imp Impairment) {
	s.mu.Lock()
	s.imp = imp
	s.mu.Unlock()
}

// schedule returns when n bytes arriving now should be delivered, and
// whether loss (UDP) or a full bottleneck queue (UDP) drops them.
func (s *shaper) schedule(n int, now time.Time, udp bool) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if udp && s.imp.Loss > 0 && s.rng.Float64() < s.imp.Loss {
		return time.Time{}, false
	}
	t := now
	if s.imp.Bandwidth > 0 {
		if s.next.After(t) {
			if udp && s.imp.Queue > 0 && s.next.Sub(t) > s.imp.Queue {
				return time.Time{}, false // drop-tail at the bottleneck
			}
			t = s.next
		}
		t = t.Add(time.Duration(int64(n) * int64(time.Second) / s.imp.Bandwidth))
		s.next = t
	}
	t = t.Add(s.imp.Latency)
	if s.imp.Jitter > 0 {
		t = t.Add(time.Duration(s.rng.Int64N(int64(s.imp.Jitter))))
	}
	if t.Before(s.last) {
		t = s.last
	}
	s.last = t
	if !udp && s.imp.Loss > 0 {
		// The stall holds this chunk and, through the connection's FIFO
		// writer, the rest of its connection — not the other connections
		// of the path, so it is not part of s.last.
		segs := (n + tcpSegment - 1) / tcpSegment
		for range segs {
			if s.rng.Float64() < s.imp.Loss {
				stall := s.imp.LossStall
				if stall <= 0 {
					stall = max(2*s.imp.Latency, time.Millisecond)
				}
				t = t.Add(stall)
				break
			}
		}
	}
	return t, true
}

// backlog returns how long data arriving now would wait for the
// serializer, and the queue bound (0: none).
func (s *shaper) backlog(now time.Time) (wait, limit time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.imp.Bandwidth <= 0 || s.imp.Queue <= 0 {
		return 0, 0
	}
	return s.next.Sub(now), s.imp.Queue
}

// gate is the blackhole switch: closed channel = open path.
type gate struct {
	mu   sync.Mutex
	on   bool
	open chan struct{} // closed while traffic flows
}

func newGate() *gate {
	g := &gate{open: make(chan struct{})}
	close(g.open)
	return g
}

func (g *gate) set(on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if on == g.on {
		return
	}
	g.on = on
	if on {
		g.open = make(chan struct{})
	} else {
		close(g.open)
	}
}

// state returns whether the blackhole is on and a channel closed when it
// goes off.
func (g *gate) state() (bool, <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.on, g.open
}

// sleepUntil waits until t or done; it reports false if done fired.
func sleepUntil(t time.Time, done <-chan struct{}) bool {
	d := time.Until(t)
	if d <= 0 {
		select {
		case <-done:
			return false
		default:
			return true
		}
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-done:
		return false
	}
}
