package netsim

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

const (
	tcpChunk      = 16 << 10
	tcpQueueLimit = 512 // chunks per direction per connection (≤ 8 MiB; small reads are copied to fit)
	tcpDialTime   = 5 * time.Second
)

// TCPProxy forwards TCP connections to one target with impairments. Every
// accepted connection gets its own upstream connection; bytes are copied
// in chunks of at most 16 KiB, each delayed by the direction's impairment.
// Half-closes (FIN) are propagated.
type TCPProxy struct {
	ln     *net.TCPListener
	target string
	opts   Options
	up     *shaper
	down   *shaper
	gate   *gate
	c      counters
	done   chan struct{}
	ctx    context.Context // cancelled by Close (aborts a pending dial)
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	pairs  map[*tcpPair]struct{}
}

type tcpPair struct {
	client, server *net.TCPConn
	done           chan struct{}
	once           sync.Once
	live           atomic.Int32 // directions still running
}

// close closes both sockets; rst resets them instead of a graceful close.
func (t *tcpPair) close(rst bool) {
	t.once.Do(func() {
		if rst {
			t.client.SetLinger(0)
			t.server.SetLinger(0)
		}
		t.client.Close()
		t.server.Close()
		close(t.done)
	})
}

type chunk struct {
	b   []byte
	due time.Time
}

// NewTCPProxy listens on 127.0.0.1 (a free port) and forwards to target
// ("host:port").
func NewTCPProxy(target string, opts Options) (*TCPProxy, error) {
	opts.defaults()
	var lc net.ListenConfig
	if opts.TCPReadBuffer > 0 {
		lc.Control = tcpSegmentOption(opts.TCPReadBuffer)
	}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ln := l.(*net.TCPListener)
	p := &TCPProxy{
		ln: ln, target: target, opts: opts,
		up: newShaper(opts.Up, opts.Seed), down: newShaper(opts.Down, opts.Seed+1),
		gate: newGate(), done: make(chan struct{}), pairs: make(map[*tcpPair]struct{}),
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.wg.Go(p.acceptLoop)
	return p, nil
}

// Addr returns the proxy's listening address.
func (p *TCPProxy) Addr() string { return p.ln.Addr().String() }

// SetUp changes the client → target impairment.
func (p *TCPProxy) SetUp(imp Impairment) { p.up.set(imp) }

// SetDown changes the target → client impairment.
func (p *TCPProxy) SetDown(imp Impairment) { p.down.set(imp) }

// Blackhole stalls (on) or resumes (off) every byte of every connection;
// new connections are accepted but carry nothing while it is on.
func (p *TCPProxy) Blackhole(on bool) { p.gate.set(on) }

// Restore ends a blackhole. (Cut connections are gone for good; new ones
// are always accepted.)
func (p *TCPProxy) Restore() { p.gate.set(false) }

// Cut resets (RST) both sockets of every current connection and returns how
// many were cut. New connections are accepted afterwards.
func (p *TCPProxy) Cut() int {
	p.mu.Lock()
	pairs := p.takePairs()
	p.mu.Unlock()
	for _, t := range pairs {
		t.close(true)
	}
	if len(pairs) > 0 {
		p.c.cuts.Add(1)
	}
	return len(pairs)
}

// Flows returns the number of live connections.
func (p *TCPProxy) Flows() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pairs)
}

// Stats returns the counters.
func (p *TCPProxy) Stats() Stats { return p.c.snapshot() }

// Close stops accepting, closes every connection and waits for all
// goroutines. Idempotent.
func (p *TCPProxy) Close() error {
	if !beginClose(&p.mu, &p.closed, p.done) {
		return nil
	}
	p.cancel()
	p.ln.Close()
	pairs := p.takePairs()
	p.mu.Unlock()
	for _, t := range pairs {
		t.close(false)
	}
	p.wg.Wait()
	return nil
}

// beginClose starts a proxy's idempotent Close (TCPProxy and UDPProxy):
// it locks mu and, unless *closed is already set (then it unlocks and
// returns false), sets it and closes done, returning true with mu held.
func beginClose(mu *sync.Mutex, closed *bool, done chan struct{}) bool {
	mu.Lock()
	if *closed {
		mu.Unlock()
		return false
	}
	*closed = true
	close(done)
	return true
}

// takePairs removes every current connection from p.pairs and returns
// them (Cut and Close); under p.mu.
func (p *TCPProxy) takePairs() []*tcpPair {
	pairs := make([]*tcpPair, 0, len(p.pairs))
	for t := range p.pairs {
		pairs = append(pairs, t)
		delete(p.pairs, t)
	}
	return pairs
}

func (p *TCPProxy) acceptLoop() {
	for {
		c, err := p.ln.AcceptTCP()
		if err != nil {
			select {
			case <-p.done:
				return
			default:
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			return
		}
		p.mu.Lock()
		full := len(p.pairs) >= p.opts.MaxFlows
		p.mu.Unlock()
		if full {
			p.c.refused.Add(1)
			c.Close()
			continue
		}
		ctx, cancel := context.WithTimeout(p.ctx, tcpDialTime)
		var d net.Dialer
		if p.opts.TCPReadBuffer > 0 {
			d.Control = tcpSegmentOption(p.opts.TCPReadBuffer)
		}
		sc, err := d.DialContext(ctx, "tcp", p.target)
		cancel()
		if err != nil {
			c.SetLinger(0)
			c.Close()
			continue
		}
		t := &tcpPair{client: c, server: sc.(*net.TCPConn), done: make(chan struct{})}
		if n := p.opts.TCPReadBuffer; n > 0 {
			_ = t.client.SetReadBuffer(n)
			_ = t.server.SetReadBuffer(n)
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			t.close(false)
			return
		}
		p.pairs[t] = struct{}{}
		p.mu.Unlock()
		p.c.flows.Add(1)
		t.live.Store(2)
		p.pipe(t, t.client, t.server, p.up, &p.c.upBytes)
		p.pipe(t, t.server, t.client, p.down, &p.c.downBytes)
	}
}

// pipe starts a reader and a writer goroutine copying src → dst.
func (p *TCPProxy) pipe(t *tcpPair, src, dst *net.TCPConn, sh *shaper, bytes *atomic.Uint64) {
	q := make(chan chunk, tcpQueueLimit)
	p.wg.Go(func() { // reader
		defer close(q)
		for {
			buf := make([]byte, tcpChunk)
			n, err := src.Read(buf)
			if n > 0 {
				if !p.waitGate(t) || !waitQueue(sh, t.done) {
					return
				}
				due, _ := sh.schedule(n, time.Now(), false)
				b := buf[:n]
				if n < tcpChunk/4 {
					b = append([]byte(nil), b...)
				}
				select {
				case q <- chunk{b: b, due: due}:
				case <-t.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	p.wg.Go(func() { // writer
		for c := range q {
			if !sleepUntil(c.due, t.done) || !p.waitGate(t) {
				return
			}
			if _, err := dst.Write(c.b); err != nil {
				t.close(true)
				p.forget(t)
				return
			}
			bytes.Add(uint64(len(c.b)))
		}
		select {
		case <-t.done:
			return
		default:
		}
		dst.CloseWrite()
		if t.live.Add(-1) == 0 {
			t.close(false)
			p.forget(t)
		}
	})
}

// waitQueue blocks while the direction's bottleneck queue is over its
// bound (backpressure: the proxy stops reading, so the sender's socket
// buffers fill); false if done fired.
func waitQueue(sh *shaper, done <-chan struct{}) bool {
	for {
		wait, limit := sh.backlog(time.Now())
		if limit <= 0 || wait <= limit {
			return true
		}
		if !sleepUntil(time.Now().Add(wait-limit), done) {
			return false
		}
	}
}

// waitGate blocks while the blackhole is on; false if the pair closed.
func (p *TCPProxy) waitGate(t *tcpPair) bool {
	for {
		on, open := p.gate.state()
		if !on {
			return true
		}
		select {
		case <-open:
		case <-t.done:
			return false
		}
	}
}

func (p *TCPProxy) forget(t *tcpPair) {
	p.mu.Lock()
	delete(p.pairs, t)
	p.mu.Unlock()
}
