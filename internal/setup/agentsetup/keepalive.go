package agentsetup

// This file is the agent's keepalive on its TCP endpoints (TLS+yamux,
// direct, through a proxy, or to a relay): the yamux ping interval,
// configured by control_plane.keepalive_interval and adapted to a network
// that cuts idle connections. A proxy such as squid (read_timeout) or
// tinyproxy (Timeout), or a NAT, that drops a tunnel after T seconds
// without traffic cuts an agent whose link is quieter than that — with the
// 10 s default, every T seconds. Each such loss is a *yamux.Conn that
// ended as "connection lost" after IdleAtLoss of silence.
//
// One such loss after at least SingleLossIdle of silence, shorter than the
// interval, is taken for the network's idle timeout: the interval drops to
// half of it (not below MinKeepAlive) at once, for the live connections and
// every later one, so an idle-cutting proxy costs one cut. Shorter idle
// losses are too close to ordinary traffic gaps to mean anything alone:
// AdaptAfter of them at about the same idle time are needed. A single loss
// can also be a peer that vanished while the link was quiet (a daemon
// killed, a path that died); so after RelaxAfter without another idle loss
// the interval goes back to the configured one, and if the network still
// cuts, the next cut shortens it again and doubles the wait before the
// next try (at most MaxRelaxAfter). The agent logs each change once, with
// the configuration key.
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
	// SingleLossIdle is the shortest idle time at which one loss is
	// taken for the network's idle timeout.
	SingleLossIdle = 2 * time.Second
	// AdaptAfter is how many consecutive idle losses at a regular idle
	// time shorter than SingleLossIdle make the agent shorten its
	// keepalive.
	AdaptAfter = 3
	// MinKeepAlive is the shortest interval adaptation chooses.
	MinKeepAlive = time.Second
	// RelaxAfter is how long a shortened interval holds before the agent
	// tries the configured one again; MaxRelaxAfter bounds its doubling.
	RelaxAfter    = 30 * time.Minute
	MaxRelaxAfter = 24 * time.Hour
)

// KeepAlive is the ping interval shared by an agent's TCP endpoint
// dialers. Safe for concurrent use.
type KeepAlive struct {
	log   *slog.Logger
	adapt bool
	floor time.Duration // MinKeepAlive (tests lower it)
	// singleLoss is SingleLossIdle (tests lower it).
	singleLoss time.Duration
	base       time.Duration // the configured interval
	// relaxAfter is the first hold of a shortened interval (RelaxAfter;
	// tests shorten it).
	relaxAfter time.Duration

	mu        sync.Mutex
	interval  time.Duration
	losses    []time.Duration // idle time of the last short losses, oldest first (≤ AdaptAfter)
	live      map[*yamux.Conn]struct{}
	hold      time.Duration // how long the next shortened interval holds (RelaxAfter, doubling)
	relax     *time.Timer   // pending return to base, or nil
	relaxedAt time.Time     // when the interval last went back to base (zero: never)
	// onAdapt and onRelax, when set (tests), are called after each
	// shortening and each return to base.
	onAdapt func(from, to, cut time.Duration)
	onRelax func()
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
	return &KeepAlive{log: log, adapt: adapt, interval: interval, base: interval, floor: MinKeepAlive, singleLoss: SingleLossIdle,
		relaxAfter: RelaxAfter, hold: RelaxAfter, live: make(map[*yamux.Conn]struct{})}
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
	var (
		from, to, cut time.Duration
		ok            bool
		n             = 1
	)
	if idle >= k.singleLoss {
		k.losses = nil
		from, to, cut, ok = k.decide([]time.Duration{idle})
	} else {
		k.losses = append(k.losses, idle)
		if len(k.losses) > AdaptAfter {
			k.losses = k.losses[1:]
		}
		if len(k.losses) == AdaptAfter {
			from, to, cut, ok = k.decide(k.losses)
			n = AdaptAfter
		}
	}
	hold := k.hold
	if ok {
		k.setLocked(to)
		k.losses = nil
		// Cut again soon after trying the configured interval: the
		// network still cuts, so try again later than last time.
		if !k.relaxedAt.IsZero() && time.Since(k.relaxedAt) < k.hold {
			k.hold = min(2*k.hold, MaxRelaxAfter)
		} else {
			k.hold = k.relaxAfter
		}
		hold = k.hold
		if k.relax != nil {
			k.relax.Stop()
		}
		k.relax = time.AfterFunc(hold, k.relaxToBase)
	}
	hook := k.onAdapt
	k.mu.Unlock()
	if !ok {
		return
	}
	k.log.Warn("the network cuts idle TCP connections: keepalive shortened",
		"idle_cut", cut.Round(100*time.Millisecond), "from", from, "to", to,
		"key", "control_plane.keepalive_interval", "losses", n, "retry_configured_after", hold)
	if hook != nil {
		hook(from, to, cut)
	}
}

// relaxToBase returns to the configured interval after a shortened one
// held for k.hold without another idle loss.
func (k *KeepAlive) relaxToBase() {
	k.mu.Lock()
	if k.interval == k.base {
		k.mu.Unlock()
		return
	}
	from := k.interval
	k.setLocked(k.base)
	k.relax = nil
	k.relaxedAt = time.Now()
	hook := k.onRelax
	k.mu.Unlock()
	if hook != nil {
		defer hook()
	}
	k.log.Info("keepalive back to the configured interval, to see whether the network still cuts idle connections",
		"from", from, "to", k.base, "key", "control_plane.keepalive_interval")
}

// setLocked changes the interval for later dials and the live connections
// (k.mu held).
func (k *KeepAlive) setLocked(d time.Duration) {
	k.interval = d
	for c := range k.live {
		c.SetKeepAliveInterval(d)
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

// decide applies the rule to losses (k.mu held): idle times that spread
// by at most a quarter of their median (at least 250 ms, a proxy's timer
// granularity is often a second), the median shorter than the interval
// (pings would otherwise have kept the link busy), and half of it, rounded
// down to 10 ms and at least the floor, below the interval.
func (k *KeepAlive) decide(losses []time.Duration) (from, to, cut time.Duration, ok bool) {
	s := slices.Sorted(slices.Values(losses))
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
		k.ka.track(yc)
		context.AfterFunc(yc.Context(), func() {
			k.ka.untrack(yc)
			if idle, lost := yc.IdleAtLoss(); lost {
				k.ka.observeLoss(idle)
			} else {
				k.ka.observeEnd(time.Since(start))
			}
		})
	}
	return c, nil
}

// track adds a live connection; one dialled before a change since its
// interval was read is brought to the current one.
func (k *KeepAlive) track(c *yamux.Conn) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.live[c] = struct{}{}
	c.SetKeepAliveInterval(k.interval)
}

func (k *KeepAlive) untrack(c *yamux.Conn) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.live, c)
}
