package agent

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
)

// Backend selection (ARCHITECTURE.md decision 11, docs/protocols/internal/
// reconnect.md). Every connect races the endpoints, happy-eyeballs style:
// each endpoint belongs to a Class, and a class starts at its offset from
// the race start (QUIC 0, WebTransport +250 ms, TLS+yamux +500 ms, relays
// +1 s by default). Within one class the endpoints are a failover list:
// the next starts when the previous failed (or Config.FallbackStagger after
// it started). When every dial in flight has failed the next endpoint starts
// at once. A candidate counts as up only when the application round trip
// TransportHelloV1 → HelloAckV1 completed over it: a TCP or TLS handshake
// that succeeds and then dies (captive portal, intercepting middlebox) never
// wins. The winner registers; the losers are closed.
//
// The winning endpoint is remembered per network (Fallback.NetworkID) for
// Fallback.MemoryTTL: the next race on the same network starts it at once
// and the others one stagger step later. While on a class worse than the
// best configured one, the agent probes the better endpoints every
// Fallback.ProbeInterval (dial + hello, then close) and moves back only
// after Fallback.ProbeSuccesses consecutive successful probes (hysteresis:
// one failure resets the count, so a path that alternates never wins). The
// move registers a new transport under the same agent session (new epoch;
// the daemon fences the old transport) and then closes the old one; running
// attempts are untouched.

// Class is a backend's place in the fallback order; lower is preferred.
type Class uint8

// Classes.
const (
	// ClassAuto derives the class from Endpoint.Backend: "webtransport" →
	// ClassWebTransport, "yamux" → ClassTCP, anything else → ClassQUIC.
	ClassAuto Class = iota
	ClassQUIC
	ClassWebTransport
	ClassTCP   // TLS+yamux, raw or HTTP/1.1 Upgrade, direct or via a CONNECT proxy
	ClassRelay // any backend to a forgeyard-relay
	numClasses
)

// String returns "quic", "webtransport", "tcp", "relay" (or "auto").
func (c Class) String() string {
	switch c {
	case ClassQUIC:
		return "quic"
	case ClassWebTransport:
		return "webtransport"
	case ClassTCP:
		return "tcp"
	case ClassRelay:
		return "relay"
	case ClassAuto:
		return "auto"
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (c Class) LogValue() slog.Value { return slog.StringValue(c.String()) }

func (e Endpoint) class() Class {
	if e.Class != ClassAuto && e.Class < numClasses {
		return e.Class
	}
	switch e.Backend {
	case "webtransport":
		return ClassWebTransport
	case "yamux":
		return ClassTCP
	}
	return ClassQUIC
}

// Fallback defaults.
const (
	DefaultMemoryTTL      = 30 * time.Minute
	DefaultProbeInterval  = 30 * time.Second
	DefaultProbeSuccesses = 3
)

// DefaultClassStagger is the default start offset of each fallback class
// after the previous one: WebTransport 250 ms after QUIC, TLS+yamux 250 ms
// after WebTransport, relays 500 ms after TLS+yamux (0, 250, 500, 1000 ms).
var DefaultClassStagger = []time.Duration{250 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond}

// Fallback tunes the backend race, its memory and the move back. The zero
// value means the defaults.
type Fallback struct {
	// ClassStagger[i] is how long after class i the class i+1 starts
	// (QUIC → WebTransport → TLS+yamux → relay); the last entry repeats. nil
	// means DefaultClassStagger. The daemon's fallback_stagger_ms
	// (RegistrationAcceptedV1) replaces it once registered, when non-empty.
	ClassStagger []time.Duration
	// MemoryTTL is how long the last good endpoint is remembered per
	// network; 0 means DefaultMemoryTTL, negative disables the memory.
	MemoryTTL time.Duration
	// ProbeInterval is how often a better class is probed while on a
	// fallback; 0 means DefaultProbeInterval, negative disables probing.
	ProbeInterval time.Duration
	// ProbeSuccesses is how many consecutive successful probes move the
	// agent back; 0 means DefaultProbeSuccesses.
	ProbeSuccesses int
	// NetworkID names the network the agent is on; nil means
	// InterfaceNetworkID.
	NetworkID func() string
}

func (f Fallback) withDefaults() Fallback {
	if f.ClassStagger == nil {
		f.ClassStagger = DefaultClassStagger
	}
	f.ClassStagger = slices.Clone(f.ClassStagger)
	f.MemoryTTL = cmp.Or(f.MemoryTTL, DefaultMemoryTTL)
	f.ProbeInterval = cmp.Or(f.ProbeInterval, DefaultProbeInterval)
	if f.ProbeSuccesses <= 0 {
		f.ProbeSuccesses = DefaultProbeSuccesses
	}
	if f.NetworkID == nil {
		f.NetworkID = InterfaceNetworkID
	}
	return f
}

// InterfaceNetworkID identifies the current network by a hash of this
// host's non-loopback, non-link-local interface addresses (as prefixes, so
// a DHCP renewal inside the same subnet keeps the identity). It returns
// "unknown" when the interfaces cannot be read.
func InterfaceNetworkID() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "unknown"
	}
	var nets []string
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.IsLoopback() || ipn.IP.IsLinkLocalUnicast() {
			continue
		}
		nets = append(nets, (&net.IPNet{IP: ipn.IP.Mask(ipn.Mask), Mask: ipn.Mask}).String())
	}
	slices.Sort(nets)
	nets = slices.Compact(nets)
	sum := sha256.Sum256([]byte(strings.Join(nets, ",")))
	return hex.EncodeToString(sum[:6])
}

// classOffsets turns per-class increments into absolute offsets.
func classOffsets(stagger []time.Duration) [numClasses]time.Duration {
	var off [numClasses]time.Duration
	if len(stagger) == 0 {
		stagger = DefaultClassStagger
	}
	for c := ClassWebTransport; c < numClasses; c++ {
		off[c] = off[c-1] + max(0, stagger[min(int(c-ClassWebTransport), len(stagger)-1)])
	}
	off[ClassAuto] = 0
	return off
}

// remembered is the last good backend class on one network.
type remembered struct {
	class   Class
	backend string
	at      time.Time
}

// plan is one race: per endpoint its earliest start, its same-class
// predecessor (-1: none) and the gap after the predecessor's start (< 0:
// only after the predecessor failed).
type plan struct {
	offset []time.Duration
	pred   []int
	gap    []time.Duration
}

// planRace computes the schedule for eps (in preference order) and names
// the remembered class it applied ("" if none).
func (a *Agent) planRace(eps []Endpoint) (plan, string) {
	a.mu.Lock()
	off := classOffsets(a.classStagger)
	sameGap := slices.Clone(a.cfg.FallbackStagger)
	var mem remembered
	memOK := false
	if a.fb.MemoryTTL > 0 {
		if r, ok := a.memory[a.network]; ok && a.now().Sub(r.at) < a.fb.MemoryTTL {
			mem, memOK = r, true
		}
	}
	a.mu.Unlock()
	p := plan{offset: make([]time.Duration, len(eps)), pred: make([]int, len(eps)), gap: make([]time.Duration, len(eps))}
	last := map[Class]int{}
	nth := map[Class]int{}
	for i, e := range eps {
		c := e.class()
		p.offset[i] = off[c]
		p.pred[i], p.gap[i] = -1, -1
		if j, ok := last[c]; ok {
			p.pred[i] = j
			if len(sameGap) > 0 {
				p.gap[i] = sameGap[min(nth[c]-1, len(sameGap)-1)]
			}
		}
		last[c] = i
		nth[c]++
	}
	if !memOK || mem.class == bestClass(eps) {
		return p, ""
	}
	if _, ok := last[mem.class]; !ok {
		return p, ""
	}
	// The remembered class starts at once; every other class one step
	// later than planned (it still wins if the remembered path is gone).
	head := off[ClassWebTransport]
	for i, e := range eps {
		if e.class() == mem.class {
			p.offset[i] = 0
		} else {
			p.offset[i] += head
		}
	}
	return p, mem.backend + " (" + mem.class.String() + ")"
}

// raceResult is one candidate's outcome.
type raceResult struct {
	i   int
	l   *link
	err error
	at  time.Duration // since the race start
}

// race dials eps per plan and returns the first candidate whose hello
// round trip completed (nil if none), with the errors of the failed
// candidates. Losers are closed. runCtx is the context the winning link
// lives in.
func (a *Agent) race(ctx context.Context, eps []Endpoint, p plan) (*raceResult, map[int]error) {
	race, cancel := context.WithCancel(ctx)
	defer cancel()
	n := len(eps)
	results := make(chan raceResult, n)
	started := make([]bool, n)
	startAt := make([]time.Duration, n)
	done := make([]bool, n)
	failed := map[int]error{}
	inflight := 0
	t0 := time.Now()
	start := func(i int) {
		started[i], startAt[i] = true, time.Since(t0)
		inflight++
		go func() {
			dctx, dcancel := context.WithTimeout(race, a.cfg.RequestTimeout) // each candidate its own deadline
			defer dcancel()
			bc, err := a.dial(dctx, eps[i])
			if err != nil {
				results <- raceResult{i: i, err: err, at: time.Since(t0)}
				return
			}
			l, err := a.handshake(dctx, ctx, eps[i], bc)
			results <- raceResult{i: i, l: l, err: err, at: time.Since(t0)}
		}()
	}
	// schedule starts what is due and returns the wait until the next
	// planned start (< 0: none).
	var schedule func() time.Duration
	schedule = func() time.Duration {
		now := time.Since(t0)
		next := time.Duration(-1)
		wake := func(at time.Duration) {
			if next < 0 || at < next {
				next = at
			}
		}
		for i := range n {
			if started[i] {
				continue
			}
			due := p.offset[i]
			if j := p.pred[i]; j >= 0 && !done[j] {
				if !started[j] || p.gap[i] < 0 {
					continue // waits for the predecessor to fail
				}
				due = max(due, startAt[j]+p.gap[i])
			}
			if due <= now {
				start(i)
			} else {
				wake(due)
			}
		}
		if inflight == 0 {
			// Everything in flight failed: pull the next one forward.
			for i := range n {
				if !started[i] {
					start(i)
					return schedule()
				}
			}
		}
		if next < 0 {
			return -1
		}
		return next - now
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	arm := func(d time.Duration) {
		timer.Stop()
		select {
		case <-timer.C:
		default:
		}
		if d >= 0 {
			timer.Reset(d)
		}
	}
	arm(schedule())
	for inflight > 0 {
		select {
		case r := <-results:
			inflight--
			done[r.i] = true
			if r.err != nil {
				failed[r.i] = r.err
				if ctx.Err() == nil {
					// Warn, at once: the operator needs e.g. a proxy's 407
					// without waiting for the slower candidates.
					a.log.Warn("endpoint failed", "endpoint", eps[r.i].Address, "backend", eps[r.i].Backend,
						"after", r.at.Round(time.Millisecond), "err", r.err)
					a.noteDialError(eps[r.i], r.err)
				}
				arm(schedule())
				continue
			}
			cancel()
			go func(k int) { // close candidates that complete anyway
				for ; k > 0; k-- {
					if o := <-results; o.l != nil {
						o.l.close(wire.CloseNormal, "lost the backend race")
					}
				}
			}(inflight)
			return &r, failed
		case <-timer.C:
			arm(schedule())
		}
	}
	return nil, failed
}

// describeRace explains why the winner won, for Status.FallbackReason.
func describeRace(eps []Endpoint, w *raceResult, failed map[int]error, memo string) string {
	win := eps[w.i]
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s answered hello after %v", win.Backend, win.Address, w.at.Round(time.Millisecond))
	if memo != "" {
		fmt.Fprintf(&b, " (remembered on this network: %s)", memo)
	}
	var lost []string
	for i, e := range eps {
		if e.class() >= win.class() || i == w.i {
			continue
		}
		if err, ok := failed[i]; ok {
			lost = append(lost, fmt.Sprintf("%s %s failed: %v", e.Backend, e.Address, err))
		} else {
			lost = append(lost, fmt.Sprintf("%s %s had not answered", e.Backend, e.Address))
		}
	}
	if len(lost) > 0 {
		b.WriteString("; preferred: " + strings.Join(lost, "; "))
	}
	return b.String()
}

// bestClass is the most preferred class among eps.
func bestClass(eps []Endpoint) Class {
	best := numClasses
	for _, e := range eps {
		best = min(best, e.class())
	}
	return best
}

// probeLoop runs while l (on class cur) is registered and a better class
// exists: every ProbeInterval it dials the better endpoints in order and
// completes a hello on the first that answers. After ProbeSuccesses
// consecutive successes it hands that last handshaken link to moves (and
// stops); otherwise the probe link is closed. Any failed probe resets the
// count.
func (a *Agent) probeLoop(ctx context.Context, cur Endpoint, eps []Endpoint, moves chan<- *link) {
	var better []Endpoint
	for _, e := range eps {
		if e.class() < cur.class() {
			better = append(better, e)
		}
	}
	if len(better) == 0 || a.fb.ProbeInterval < 0 {
		return
	}
	t := time.NewTicker(a.fb.ProbeInterval)
	defer t.Stop()
	streak := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var got *link
		var errs []string
		for _, e := range better {
			pctx, cancel := context.WithTimeout(ctx, a.cfg.RequestTimeout)
			bc, err := a.dial(pctx, e)
			if err == nil {
				got, err = a.handshake(pctx, ctx, e, bc)
			}
			cancel()
			if err == nil {
				break
			}
			errs = append(errs, fmt.Sprintf("%s %s: %v", e.Backend, e.Address, err))
		}
		a.st.probes.Add(1)
		if got == nil {
			streak = 0
			a.setProbeNote(fmt.Sprintf("probe of the preferred backend failed (%s)", strings.Join(errs, "; ")))
			continue
		}
		streak++
		a.st.probesOK.Add(1)
		if streak < a.fb.ProbeSuccesses {
			a.setProbeNote(fmt.Sprintf("%s %s answered %d of %d consecutive probes needed to move back", got.ep.Backend, got.ep.Address, streak, a.fb.ProbeSuccesses))
			got.close(wire.CloseNormal, "probe")
			continue
		}
		select {
		case moves <- got:
		case <-ctx.Done():
			got.close(wire.CloseNormal, "probe")
		}
		return
	}
}

func (a *Agent) setProbeNote(s string) {
	a.mu.Lock()
	a.probeNote = s
	a.mu.Unlock()
}

// noteRegistered records a registration over ep: the memory for this
// network, the reason shown in Status, and a backend change.
func (a *Agent) noteRegistered(ep Endpoint, reason string, eps []Endpoint) {
	a.mu.Lock()
	if a.fb.MemoryTTL > 0 {
		a.memory[a.network] = remembered{class: ep.class(), backend: ep.Backend, at: a.now()}
	}
	from := a.lastBackend
	if from == "" && ep.class() > bestClass(eps) {
		for _, e := range eps {
			if e.class() == bestClass(eps) {
				from = e.Backend
				break
			}
		}
	}
	changed := from != "" && from != ep.Backend
	if changed {
		a.changes[BackendChange{From: from, To: ep.Backend}]++
		a.cfg.Metrics.Fallback(from, ep.Backend) // forgeyard_transport_fallback_events_total
	}
	a.lastBackend = ep.Backend
	a.reason, a.probeNote = reason, ""
	network := a.network
	a.mu.Unlock()
	a.log.Info("backend chosen", "backend", ep.Backend, "class", ep.class().String(), "endpoint", ep.Address,
		"network", network, "reason", reason)
	if changed {
		if h := a.cfg.Hooks.OnBackendChange; h != nil {
			h(BackendChange{From: from, To: ep.Backend}, reason)
		}
	}
}

// BackendChange is a move between backends (a fallback or a move back),
// counted in Stats.BackendChanges.
type BackendChange struct {
	From, To string // Endpoint.Backend names
}

// dial opens a backend connection to e, as a transport.connect span (§210).
func (a *Agent) dial(ctx context.Context, e Endpoint) (semantics.BackendConn, error) {
	_, sp := a.cfg.Tracing.Start(ctx, telemetry.SpanConnect, telemetry.AttrBackend(e.Backend))
	bc, err := e.Dialer.Dial(ctx, e.Address)
	telemetry.End(sp, err)
	return bc, err
}
