package agentsetup

// This file is the agent's keepalive on its TCP endpoints (TLS+yamux,
// direct, through a proxy, or to a relay): the yamux ping interval,
// configured by control_plane.keepalive_interval and adapted to a network
// that cuts idle connections. A proxy such as squid (read_timeout) or
// tinyproxy (Timeout), or a NAT, that drops a tunnel after T seconds
// without traffic cuts an agent whose link is quieter than that — with the
// 10 s default, every T seconds. Each such loss is a *yamux.Conn that
// ended as "connection lost" after IdleAtLoss of silence; when the last
// AdaptAfter losses were at about the same idle time, shorter than the
// interval, the cut is the network's idle timeout, and the interval drops
// to half of it (not below MinKeepAlive) for every later connection. The
// agent logs that once per change, with the configuration key.

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/semantics"
)

// Keepalive adaptation.
const (
	// AdaptAfter is how many consecutive idle losses at a regular idle
	// time make the agent shorten its keepalive.
	AdaptAfter = 3
	// MinKeepAlive is the shortest interval adaptation chooses.
	MinKeepAlive = time.Second
)

// KeepAlive is the ping interval shared by an agent's TCP endpoint
// dialers. Safe for concurrent use.
type KeepAlive struct {
	log   *slog.Logger
	adapt bool
	floor time.Duration // MinKeepAlive (tests lower it)

	mu       sync.Mutex
	interval time.Duration
	losses   []time.Duration // idle time of the last losses, oldest first (≤ AdaptAfter)
	// onAdapt, when set (tests), is called after each change.
	onAdapt func(from, to, cut time.Duration)
}

// NewKeepAlive returns the keepalive state: interval (0 means
// yamux.DefaultKeepAliveInterval), adapted to idle cuts when adapt is set.
// log receives the one line per change (nil discards).
func NewKeepAlive(interval time.Duration, adapt bool, log *slog.Logger) *KeepAlive {
	if interval <= 0 {
		interval = yamux.DefaultKeepAliveInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &KeepAlive{log: log, adapt: adapt, interval: interval, floor: MinKeepAlive}
}

// Interval is the current ping interval.
func (k *KeepAlive) Interval() time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.interval
}

// observeLoss records a connection lost after idle without traffic.
func (k *KeepAlive) observeLoss(idle time.Duration) {
	k.mu.Lock()
	if !k.adapt {
		k.mu.Unlock()
		return
	}
	k.losses = append(k.losses, idle)
	if len(k.losses) > AdaptAfter {
		k.losses = k.losses[1:]
	}
	from, to, cut, ok := k.decide()
	if ok {
		k.interval = to
		k.losses = nil
	}
	hook := k.onAdapt
	k.mu.Unlock()
	if !ok {
		return
	}
	k.log.Warn("the network cuts idle TCP connections: keepalive shortened",
		"idle_cut", cut.Round(100*time.Millisecond), "from", from, "to", to,
		"key", "control_plane.keepalive_interval", "losses", AdaptAfter)
	if hook != nil {
		hook(from, to, cut)
	}
}

// observeEnd records a connection that ended any other way (a close record,
// the idle timeout, a local close) after lived: one that outlived the
// losses recorded so far by more than the interval was not cut when idle,
// so the run of idle losses is broken. A shorter one (a losing race
// candidate, a probe) says nothing about the path's idle timeout.
func (k *KeepAlive) observeEnd(lived time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.losses) == 0 {
		return
	}
	if lived > slices.Max(k.losses)+k.interval {
		k.losses = nil
	}
}

// decide applies the rule to k.losses (k.mu held): AdaptAfter losses whose
// idle times spread by at most a quarter of their median (at least 250 ms,
// a proxy's timer granularity is often a second), the median shorter than
// the interval (pings would otherwise have kept the link busy), and half of
// it, rounded down to 10 ms and at least MinKeepAlive, below the interval.
func (k *KeepAlive) decide() (from, to, cut time.Duration, ok bool) {
	if len(k.losses) < AdaptAfter {
		return 0, 0, 0, false
	}
	s := slices.Sorted(slices.Values(k.losses))
	med := s[len(s)/2]
	if s[len(s)-1]-s[0] > max(med/4, 250*time.Millisecond) || med >= k.interval+250*time.Millisecond {
		return 0, 0, 0, false
	}
	to = max(k.floor, (med / 2).Truncate(10*time.Millisecond))
	if to >= k.interval {
		return 0, 0, 0, false
	}
	return k.interval, to, med, true
}

// keepAliveDialer dials a yamux endpoint with the current interval and
// reports how its connection ended.
type keepAliveDialer struct {
	d  yamux.Dialer
	ka *KeepAlive
}

func (k keepAliveDialer) Dial(ctx context.Context, addr string) (semantics.BackendConn, error) {
	d := k.d
	d.Config.KeepAliveInterval = k.ka.Interval()
	c, err := d.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	if yc, ok := c.(*yamux.Conn); ok {
		start := time.Now()
		context.AfterFunc(yc.Context(), func() {
			if idle, lost := yc.IdleAtLoss(); lost {
				k.ka.observeLoss(idle)
			} else {
				k.ka.observeEnd(time.Since(start))
			}
		})
	}
	return c, nil
}
