package memory

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"

	"forgeyard.dev/transport/backends/internal/acceptq"
	"forgeyard.dev/transport/semantics"
)

// Network is an in-process registry of listeners by address. The zero value
// is not usable; use NewNetwork or DefaultNetwork. Safe for concurrent use.
type Network struct {
	mu        sync.Mutex
	listeners map[string]*Listener
	seq       uint64
}

// NewNetwork returns an empty network.
func NewNetwork() *Network { return &Network{listeners: map[string]*Listener{}} }

// DefaultNetwork serves NewListener and Dialers whose Network is nil.
var DefaultNetwork = NewNetwork()

// Errors of the memory network.
var (
	ErrAddrInUse       = errors.New("memory: address already in use")
	ErrConnRefused     = errors.New("memory: connection refused (no listener)")
	ErrListenerClosed  = errors.New("memory: listener closed")
	ErrBacklogExceeded = errors.New("memory: listener backlog full")
)

// AcceptBacklog bounds the handshaken connections waiting in Accept.
const AcceptBacklog = 128

// NewListener listens on DefaultNetwork; see Network.Listen.
func NewListener(name string, conf *tls.Config) (*Listener, error) {
	return DefaultNetwork.Listen(name, conf)
}

// Listen registers a listener at addr ("" picks a fresh unique name).
// conf is the server TLS configuration (certificates, ClientAuth,
// ClientCAs, NextProtos; ALPN defaults to ALPN). A nil conf accepts
// connections without TLS semantics (zero ConnectionState). The
// configuration is cloned.
func (n *Network) Listen(addr string, conf *tls.Config) (*Listener, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if addr == "" {
		n.seq++
		addr = "memory-" + itoa(n.seq)
	}
	if _, ok := n.listeners[addr]; ok {
		return nil, fmt.Errorf("%w: %s", ErrAddrInUse, addr)
	}
	l := &Listener{net: n, addr: Addr{Name: addr}, conf: withALPN(conf),
		incoming: make(chan *Conn, AcceptBacklog), closed: make(chan struct{})}
	n.listeners[addr] = l
	return l, nil
}

func withALPN(c *tls.Config) *tls.Config {
	if c == nil {
		return nil
	}
	c = c.Clone()
	if len(c.NextProtos) == 0 {
		c.NextProtos = []string{ALPN}
	}
	return c
}

// Dial connects to the listener at addr; see Dialer.
func (n *Network) Dial(ctx context.Context, addr string, conf *tls.Config, opts Options) (*Conn, error) {
	n.mu.Lock()
	l := n.listeners[addr]
	n.seq++
	local := Addr{Name: "client-" + itoa(n.seq)}
	n.mu.Unlock()
	if l == nil {
		return nil, fmt.Errorf("memory: dial %s: %w", addr, ErrConnRefused)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	conf = withALPN(conf)
	var cst, sst tls.ConnectionState
	if conf != nil || l.conf != nil {
		if conf == nil || l.conf == nil {
			return nil, fmt.Errorf("memory: dial %s: TLS configured on one side only", addr)
		}
		var err error
		cst, sst, err = handshake(conf, l.conf, addr)
		if err != nil {
			return nil, fmt.Errorf("memory: dial %s: %w", addr, err)
		}
	}
	c, s := newPair(opts, local, l.addr, cst, sst)
	select {
	case <-l.closed:
		err := fmt.Errorf("memory: dial %s: %w", addr, ErrConnRefused)
		c.Disconnect()
		return nil, err
	default:
	}
	select {
	case l.incoming <- s:
		return c, nil
	default:
		c.Disconnect()
		return nil, fmt.Errorf("memory: dial %s: %w", addr, ErrBacklogExceeded)
	}
}

// Listener accepts memory connections. It implements
// semantics.BackendListener; safe for concurrent use.
type Listener struct {
	net      *Network
	addr     Addr
	conf     *tls.Config
	incoming chan *Conn
	once     sync.Once
	closed   chan struct{}
}

var _ semantics.BackendListener = (*Listener)(nil)

// Accept returns the next connection whose handshake succeeded. It returns
// ErrListenerClosed (wrapping net.ErrClosed) after Close, or ctx's error.
func (l *Listener) Accept(ctx context.Context) (semantics.BackendConn, error) {
	select {
	case c := <-l.incoming:
		return c, nil
	case <-l.closed:
		return nil, fmt.Errorf("%w: %w", ErrListenerClosed, net.ErrClosed)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Addr returns the listener's address.
func (l *Listener) Addr() net.Addr { return l.addr }

// Close unregisters the listener and closes connections not yet accepted
// (with CloseShutdown). Established connections are unaffected. Idempotent.
func (l *Listener) Close() error {
	l.once.Do(func() {
		l.net.mu.Lock()
		if l.net.listeners[l.addr.Name] == l {
			delete(l.net.listeners, l.addr.Name)
		}
		close(l.closed)
		l.net.mu.Unlock()
		acceptq.CloseQueued(l.incoming)
	})
	return nil
}

// Dialer dials memory connections. The zero value dials on DefaultNetwork
// without TLS semantics.
type Dialer struct {
	// Network to dial on; nil means DefaultNetwork.
	Network *Network
	// TLSConfig is the client TLS configuration (Certificates, RootCAs,
	// ServerName, NextProtos; ALPN defaults to ALPN). It must be set when
	// the listener has one. A ServerName of "" uses addr.
	TLSConfig *tls.Config
	// Options configures the connection pair (latency, bandwidth, cuts).
	Options Options
}

var _ semantics.BackendDialer = (*Dialer)(nil)

// Dial connects to the listener at addr and runs the in-memory handshake.
// Errors: ErrConnRefused (no listener), ErrBacklogExceeded, a
// certificate verification error from either side (see handshake), or
// ctx's error.
func (d *Dialer) Dial(ctx context.Context, addr string) (semantics.BackendConn, error) {
	n := d.Network
	if n == nil {
		n = DefaultNetwork
	}
	c, err := n.Dial(ctx, addr, d.TLSConfig, d.Options)
	if err != nil {
		return nil, err
	}
	return c, nil
}
