package netsim

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// maxDeadFlows bounds the remembered cut flows; beyond it the oldest
// knowledge is dropped (their packets then open new flows).
const maxDeadFlows = 4096

// UDPProxy forwards UDP datagrams between clients and one target with
// impairments. Each client source address is a flow with its own upstream
// socket, so the target sees one peer per client.
type UDPProxy struct {
	ln     *net.UDPConn
	target *net.UDPAddr
	opts   Options
	up     *shaper
	down   *shaper
	gate   *gate
	c      counters
	upQ    chan udpPacket
	downQ  chan udpPacket
	done   chan struct{}
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	flows  map[string]*udpFlow
	dead   map[string]struct{}
}

type udpFlow struct {
	key    string
	client *net.UDPAddr
	conn   *net.UDPConn
	last   atomic.Int64 // unix nanos of the last packet either way
	dead   atomic.Bool
}

type udpPacket struct {
	f   *udpFlow
	b   []byte
	due time.Time
}

// NewUDPProxy listens on 127.0.0.1 (a free port) and forwards to target
// ("host:port").
func NewUDPProxy(target string, opts Options) (*UDPProxy, error) {
	opts.defaults()
	ta, err := net.ResolveUDPAddr("udp", target)
	if err != nil {
		return nil, err
	}
	ln, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	p := &UDPProxy{
		ln: ln, target: ta, opts: opts,
		up: newShaper(opts.Up, opts.Seed), down: newShaper(opts.Down, opts.Seed+1),
		gate:  newGate(),
		upQ:   make(chan udpPacket, opts.QueuePackets),
		downQ: make(chan udpPacket, opts.QueuePackets),
		done:  make(chan struct{}),
		flows: make(map[string]*udpFlow),
		dead:  make(map[string]struct{}),
	}
	p.wg.Go(p.readLoop)
	p.wg.Go(func() { p.deliver(p.upQ, true) })
	p.wg.Go(func() { p.deliver(p.downQ, false) })
	return p, nil
}

// Addr returns the proxy's listening address ("127.0.0.1:port"): dial this
// instead of the target.
func (p *UDPProxy) Addr() string { return p.ln.LocalAddr().String() }

// SetUp and SetDown change the impairment of one direction; packets already
// scheduled keep their delivery time.
func (p *UDPProxy) SetUp(imp Impairment) { p.up.set(imp) }

// SetDown changes the target → client impairment.
func (p *UDPProxy) SetDown(imp Impairment) { p.down.set(imp) }

// Blackhole turns the blackhole on or off: while on, every datagram (new or
// already queued) is dropped.
func (p *UDPProxy) Blackhole(on bool) { p.gate.set(on) }

// Cut severs every current flow: its upstream socket is closed and its
// datagrams are dropped in both directions until Restore. New flows pass.
// It returns the number of flows cut.
func (p *UDPProxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for k, f := range p.flows {
		f.dead.Store(true)
		f.conn.Close()
		delete(p.flows, k)
		if len(p.dead) >= maxDeadFlows {
			clear(p.dead)
		}
		p.dead[k] = struct{}{}
		n++
	}
	if n > 0 {
		p.c.cuts.Add(1)
	}
	return n
}

// Restore ends a blackhole and forgets cut flows (their datagrams open new
// flows again).
func (p *UDPProxy) Restore() {
	p.gate.set(false)
	p.mu.Lock()
	clear(p.dead)
	p.mu.Unlock()
}

// Flows returns the number of live flows.
func (p *UDPProxy) Flows() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.flows)
}

// Stats returns the counters.
func (p *UDPProxy) Stats() Stats { return p.c.snapshot() }

// Close stops the proxy and waits for its goroutines. Idempotent.
func (p *UDPProxy) Close() error {
	if !beginClose(&p.mu, &p.closed, p.done) {
		return nil
	}
	p.ln.Close()
	for k, f := range p.flows {
		f.conn.Close()
		delete(p.flows, k)
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

func (p *UDPProxy) readLoop() {
	buf := make([]byte, 64<<10)
	for {
		n, addr, err := p.ln.ReadFromUDP(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			select {
			case <-p.done:
				return
			default:
				continue // transient (e.g. ICMP-induced) errors
			}
		}
		f := p.flow(addr)
		if f == nil {
			p.c.upDropped.Add(1)
			continue
		}
		p.enqueue(f, buf[:n], p.up, p.upQ, false, &p.c.upDropped)
	}
}

// enqueue passes a datagram b of f (copied) through shaper s into q,
// unless the gate is closed or (with whenDead) f is cut: one direction of
// the proxy. A datagram not queued counts in dropped.
func (p *UDPProxy) enqueue(f *udpFlow, b []byte, s *shaper, q chan udpPacket, whenDead bool, dropped *atomic.Uint64) {
	f.last.Store(time.Now().UnixNano())
	if on, _ := p.gate.state(); on || (whenDead && f.dead.Load()) {
		dropped.Add(1)
		return
	}
	due, ok := s.schedule(len(b), time.Now(), true)
	if !ok {
		dropped.Add(1)
		return
	}
	select {
	case q <- udpPacket{f: f, b: append([]byte(nil), b...), due: due}:
	default:
		dropped.Add(1)
	}
}

// flow returns the flow of addr, creating it; nil if it is cut, over the
// limit or the proxy is closed.
func (p *UDPProxy) flow(addr *net.UDPAddr) *udpFlow {
	key := addr.String()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	if f := p.flows[key]; f != nil {
		return f
	}
	if _, cut := p.dead[key]; cut {
		return nil
	}
	if len(p.flows) >= p.opts.MaxFlows {
		p.c.refused.Add(1)
		return nil
	}
	conn, err := net.DialUDP("udp", nil, p.target)
	if err != nil {
		return nil
	}
	f := &udpFlow{key: key, client: addr, conn: conn}
	f.last.Store(time.Now().UnixNano())
	p.flows[key] = f
	p.c.flows.Add(1)
	p.wg.Go(func() { p.upstreamLoop(f) })
	return f
}

func (p *UDPProxy) upstreamLoop(f *udpFlow) {
	buf := make([]byte, 64<<10)
	for {
		f.conn.SetReadDeadline(time.Now().Add(p.opts.FlowIdleTimeout))
		n, err := f.conn.Read(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !f.dead.Load() {
				if time.Since(time.Unix(0, f.last.Load())) < p.opts.FlowIdleTimeout {
					continue
				}
				p.mu.Lock()
				if p.flows[f.key] == f {
					delete(p.flows, f.key)
				}
				p.mu.Unlock()
				f.conn.Close()
				return
			}
			if errors.Is(err, net.ErrClosed) || f.dead.Load() {
				return
			}
			select {
			case <-p.done:
				return
			default:
				continue // ECONNREFUSED from an ICMP port unreachable, etc.
			}
		}
		p.enqueue(f, buf[:n], p.down, p.downQ, true, &p.c.downDropped)
	}
}

func (p *UDPProxy) deliver(q chan udpPacket, up bool) {
	dropped, bytes := &p.c.downDropped, &p.c.downBytes
	if up {
		dropped, bytes = &p.c.upDropped, &p.c.upBytes
	}
	for {
		var pkt udpPacket
		select {
		case pkt = <-q:
		case <-p.done:
			return
		}
		if !sleepUntil(pkt.due, p.done) {
			return
		}
		if on, _ := p.gate.state(); on || pkt.f.dead.Load() {
			dropped.Add(1)
			continue
		}
		var err error
		if up {
			_, err = pkt.f.conn.Write(pkt.b)
		} else {
			_, err = p.ln.WriteToUDP(pkt.b, pkt.f.client)
		}
		if err != nil {
			dropped.Add(1)
			continue
		}
		bytes.Add(uint64(len(pkt.b)))
	}
}
