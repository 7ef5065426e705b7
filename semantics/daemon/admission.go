package daemon

import (
	"context"
	"errors"
	"fmt"
	"forgeyard.dev/transport/semantics/ratemeter"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/internal/tokenbucket"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// hardening is the daemon's admission state and rate-limit counters.
type hardening struct {
	adm Admission

	mu         sync.Mutex
	handshakes int
	perIP      map[netip.Addr]int
	regs       *tokenbucket.Bucket
	// regRate measures registrations completed per second while others
	// waited (handshakes > 0): the rate this daemon works through its
	// backlog, measured, for AdmitEarly's time bound.
	regRate ratemeter.Meter

	refusedConns, refusedRegs, limitCloses, audits atomic.Int64
	refusedEarly                                   atomic.Int64 // AdmitEarly refusals (before a handshake)
	earlySeen                                      atomic.Bool  // a QUIC listener asks AdmitEarly
	rateLimited                                    [numRateClasses]atomic.Int64
	secretsSent, secretsRefused                    atomic.Int64
	deferred                                       atomic.Int64 // refusals sent as RegistrationDeferredV1 (pacing.go)
	held                                           atomic.Int64 // hellos held for their registration token (pacing.go)
}

func (d *Daemon) initHardening() {
	h := &d.hard
	h.adm = d.cfg.Bounds.Admission.withDefaults()
	h.perIP = map[netip.Addr]int{}
	h.regs = newBucket(h.adm.RegistrationRate)
}

// HardeningStats are the admission, rate-limit and secret counters.
type HardeningStats struct {
	RefusedConns         int64 // closed with CloseOverloaded at connect (handshakes, per-IP, connection cap)
	RefusedEarly         int64 // refused by AdmitEarly before their handshake (connection cap)
	RefusedRegistrations int64 // hellos answered Overloaded (registration rate, connection cap)
	// DeferredRegistrations counts the refused hellos answered with
	// RegistrationDeferredV1 (a structured retry hint; pacing.go); the
	// rest of RefusedRegistrations got RegistrationRejectedV1.
	DeferredRegistrations int64
	// HeldRegistrations counts the hellos held for their token of the
	// registration rate (at most MaxRegistrationHold) and then admitted.
	HeldRegistrations int64
	RateLimited       struct {
		Control, Heartbeat, Health, Cas, Identity int64
	}
	LimitCloses    int64 // connections closed with CloseLimitExceeded for rate strikes
	AuditEvents    int64 // audit events of the admission/replay paths (the daemon's other audit events are not counted here)
	SecretsSent    int64 // secret streams the agent acknowledged
	SecretsRefused int64 // secret streams the agent refused or that failed
	Handshakes     int   // connections currently connected and not yet registered
}

// HardeningStats returns a snapshot of the admission and rate-limit
// counters.
func (d *Daemon) HardeningStats() HardeningStats {
	h := &d.hard
	var s HardeningStats
	s.RefusedConns, s.RefusedRegistrations = h.refusedConns.Load(), h.refusedRegs.Load()
	s.RefusedEarly = h.refusedEarly.Load()
	s.DeferredRegistrations, s.HeldRegistrations = h.deferred.Load(), h.held.Load()
	s.RateLimited.Control, s.RateLimited.Heartbeat = h.rateLimited[rateControl].Load(), h.rateLimited[rateHeartbeat].Load()
	s.RateLimited.Health, s.RateLimited.Cas = h.rateLimited[rateHealth].Load(), h.rateLimited[rateCas].Load()
	s.RateLimited.Identity = h.rateLimited[rateIdentity].Load()
	s.LimitCloses, s.AuditEvents = h.limitCloses.Load(), h.audits.Load()
	s.SecretsSent, s.SecretsRefused = h.secretsSent.Load(), h.secretsRefused.Load()
	h.mu.Lock()
	s.Handshakes = h.handshakes
	h.mu.Unlock()
	return s
}

// admissionTicket is what a connection holds of the admission counters;
// released at registration (the handshake) and at teardown (both).
type admissionTicket struct {
	ip        netip.Addr
	hasIP     bool
	handshake bool
	held      bool
}

func ipOf(a net.Addr) (netip.Addr, bool) {
	switch v := a.(type) {
	case *net.UDPAddr:
		if v != nil {
			ip, ok := netip.AddrFromSlice(v.IP)
			return ip.Unmap(), ok
		}
	case *net.TCPAddr:
		if v != nil {
			ip, ok := netip.AddrFromSlice(v.IP)
			return ip.Unmap(), ok
		}
	}
	if a == nil {
		return netip.Addr{}, false
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}

// capacityRefusal explains why the daemon is at its connection cap or
// descriptor headroom, or returns "". conns is the connected count.
func (d *Daemon) capacityRefusal(conns int) string {
	a := &d.hard.adm
	if a.MaxConnections > 0 && conns >= a.MaxConnections {
		return fmt.Sprintf("overloaded: %d connections (the daemon's cap); retry with backoff", conns)
	}
	if of := d.cfg.OpenFiles; of != nil {
		if open, limit := of(); limit > 0 && limit-open < a.FDHeadroom {
			return fmt.Sprintf("overloaded: %d of %d file descriptors in use; retry with backoff", open, limit)
		}
	}
	return ""
}

// AdmitEarly tells whether the daemon would take one more connection
// (its MaxConnections cap and descriptor headroom, with the handshakes in
// progress counted, and its MaxHandshakes of connections awaiting
// registration). Listeners that can ask before a handshake call it
// then (backends/quic Config.Admit), so a refused attempt costs no
// cryptography; the error says why. It is cheap: one lock, two counts.
func (d *Daemon) AdmitEarly(net.Addr) error {
	d.hard.earlySeen.Store(true)
	if why := d.capacityRefusal(d.connCount()); why != "" {
		d.hard.refusedEarly.Add(1)
		return errors.New(why)
	}
	// Connected but not registered at the cap: a handshake now would be
	// closed Overloaded once paid for (admitConn); refuse it before.
	h := &d.hard
	h.mu.Lock()
	n := h.handshakes
	h.mu.Unlock()
	if n >= h.adm.MaxHandshakes {
		h.refusedEarly.Add(1)
		return fmt.Errorf("overloaded: %d connections awaiting registration", n)
	}
	// The backlog bounded by time: at the measured rate, a connection
	// admitted now would register after n/rate. Beyond registrationQueueWait
	// it would wait out its agent's request timeout (and the daemon's
	// RegistrationTimeout) with its handshake paid: refuse it before.
	if err := backlogFull(n, h.regRate.Rate()); err != nil {
		h.refusedEarly.Add(1)
		return err
	}
	return nil
}

// RegistrationBacklog reports the connections awaiting registration and
// the rate at which the daemon registers them while some wait (0: not
// measured yet). A QUIC listener bounds the attempts in progress by it,
// from the first Initial to registration (backends/quic Config.Backlog).
// It is cheap: one lock, one count.
func (d *Daemon) RegistrationBacklog() (pending int, perSecond float64) {
	h := &d.hard
	h.mu.Lock()
	pending = h.handshakes
	h.mu.Unlock()
	return pending, h.regRate.Rate()
}

// backlogFull refuses a new attempt when n connections awaiting
// registration would take longer than registrationQueueWait at rate
// registrations/s (0: not measured yet, no bound).
func backlogFull(n int, rate float64) error {
	if rate <= 0 || n <= 0 {
		return nil
	}
	if wait := time.Duration(float64(n) / rate * float64(time.Second)); wait > registrationQueueWait {
		return fmt.Errorf("overloaded: %d connections awaiting registration at %.0f/s (%v > %v)", n, rate, wait.Round(time.Millisecond), registrationQueueWait)
	}
	return nil
}

// registrationQueueWait bounds how long, at the measured registration
// rate, the connections awaiting registration would take to register: a
// new QUIC attempt beyond it is refused before its handshake. With the
// QUIC listener's handshake queue (at most 3 s) it stays below the
// agents' 10 s request timeout and the daemon's RegistrationTimeout.
const registrationQueueWait = 4 * time.Second

// admitConn takes a handshake slot and a per-IP slot for bc, or explains
// the refusal. It costs no I/O: a refused connection is closed before its
// control stream is read.
func (d *Daemon) admitConn(bc semantics.BackendConn) (admissionTicket, string) {
	h := &d.hard
	ip, hasIP := ipOf(bc.RemoteAddr())
	if why := d.capacityRefusal(d.connCount()); why != "" {
		return admissionTicket{}, why
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	// A QUIC listener that admits before the handshake (AdmitEarly) stops
	// new attempts at MaxHandshakes; the handshakes it had already begun
	// end here paid for, and are served up to twice the cap instead of
	// being thrown away. Other connections stop at the cap.
	limit := h.adm.MaxHandshakes
	if bc.Backend() == "quic" && h.earlySeen.Load() {
		limit *= 2
	}
	if h.handshakes >= limit {
		return admissionTicket{}, fmt.Sprintf("overloaded: %d handshakes in progress; retry with backoff", h.handshakes)
	}
	if hasIP && h.adm.MaxConnsPerIP > 0 && h.perIP[ip] >= h.adm.MaxConnsPerIP {
		return admissionTicket{}, fmt.Sprintf("overloaded: %d connections from this address; retry with backoff", h.perIP[ip])
	}
	h.handshakes++
	t := admissionTicket{handshake: true, held: true}
	if hasIP && h.adm.MaxConnsPerIP > 0 {
		h.perIP[ip]++
		t.ip, t.hasIP = ip, true
	}
	return t, ""
}

// handshakeDone releases c's handshake slot (registration accepted, or
// teardown).
func (c *conn) handshakeDone() {
	h := &c.d.hard
	h.mu.Lock()
	if c.adm.handshake {
		c.adm.handshake = false
		h.handshakes--
	}
	h.mu.Unlock()
}

// registrationDone releases c's handshake slot once its registration was
// accepted, and counts it towards the measured registration rate.
func (c *conn) registrationDone() {
	h := &c.d.hard
	h.mu.Lock()
	was := c.adm.handshake
	if was {
		c.adm.handshake = false
		h.handshakes--
	}
	busy := h.handshakes > 0
	h.mu.Unlock()
	if was {
		h.regRate.Tick(time.Now(), busy)
	}
}

// releaseAdmission releases everything c holds (teardown).
func (c *conn) releaseAdmission() {
	c.handshakeDone()
	h := &c.d.hard
	h.mu.Lock()
	if c.adm.hasIP {
		c.adm.hasIP = false
		if h.perIP[c.adm.ip]--; h.perIP[c.adm.ip] <= 0 {
			delete(h.perIP, c.adm.ip)
		}
	}
	h.mu.Unlock()
}

// serveAdmitted is ServeConn behind admission control.
func (d *Daemon) serveAdmitted(ctx context.Context, bc semantics.BackendConn) bool {
	t, why := d.admitConn(bc)
	if why != "" {
		d.hard.refusedConns.Add(1)
		d.log.Info("connection refused by admission control", "remote", bc.RemoteAddr().String(), "reason", why)
		_ = bc.CloseWithCode(wire.CloseOverloaded, why)
		return false
	}
	c, err := d.newConn(bc)
	if err != nil {
		d.hard.mu.Lock()
		d.hard.handshakes--
		if t.hasIP {
			if d.hard.perIP[t.ip]--; d.hard.perIP[t.ip] <= 0 {
				delete(d.hard.perIP, t.ip)
			}
		}
		d.hard.mu.Unlock()
		_ = bc.CloseWithCode(wire.CloseShutdown, err.Error())
		return true
	}
	c.adm = t
	c.serve(ctx)
	return true
}

// admitRegistration applies the daemon-wide admission to a hello: the
// connection cap and the registration rate (pacing.go: a hello over the
// rate is held for its token up to MaxRegistrationHold, else deferred with
// a spread retry hint, and the connection closed with CloseOverloaded).
func (c *conn) admitRegistration(env *wire.Envelope, hello *agentwire.TransportHelloV1) bool {
	// At the cap this transport is counted already: refuse only beyond it.
	if why := c.d.capacityRefusal(c.d.connCount() - 1); why != "" {
		c.deferRegistration(env, hello, wire.ErrCodeOverloaded, why, c.d.capacityHint(), "connection cap")
		return false
	}
	wait, admit := c.d.registrationWait(time.Now())
	if admit {
		return wait == 0 || c.holdHello(wait)
	}
	c.deferRegistration(env, hello, wire.ErrCodeOverloaded,
		fmt.Sprintf("registration rate limit (%s) reached", c.d.hard.adm.RegistrationRate), wait, "registration rate limit")
	return false
}

// auditEvent emits a security audit event for c (§279).
func (c *conn) auditEvent(ev telemetry.AuditEvent, code wire.ProtocolErrorCode, reason telemetry.AuditReason) {
	c.d.hard.audits.Add(1)
	c.emitAudit(ev, code, reason)
}

// emitAudit writes a typed audit record about this transport (its runner
// and session when registered) with extra attributes.
func (c *conn) emitAudit(ev telemetry.AuditEvent, code wire.ProtocolErrorCode, reason telemetry.AuditReason, extra ...telemetry.AuditAttr) {
	runner, sess, _, _ := c.ident()
	attrs := append([]telemetry.AuditAttr{telemetry.Transport(c.transport), telemetry.Remote(c.bc.RemoteAddr()),
		telemetry.Code(code), telemetry.Reason(reason)}, extra...)
	if runner != (wire.RunnerId{}) {
		attrs = append(attrs, telemetry.Runner(runner))
	}
	if sess != (wire.AgentSessionId{}) {
		attrs = append(attrs, telemetry.Session(sess))
	}
	c.d.audit.Emit(context.Background(), ev, attrs...)
}

// versionRefusal is the message refusing a hello whose versions do not
// meet the daemon's: when its best common version with the daemon's full
// range is below the policy minimum (a downgrade, §274), it names the
// minimum; otherwise it is the negotiation error.
func (c *conn) versionRefusal(m *agentwire.TransportHelloV1, nerr error) string {
	d := c.d
	best, err := wire.Negotiate(d.cfg.Protocol, m.Versions)
	if err != nil || d.cfg.MinProtocol == (wire.ProtocolVersion{}) || !best.Less(d.cfg.MinProtocol) {
		return nerr.Error()
	}
	return fmt.Sprintf("protocol %s is below this daemon's policy minimum %s; insecure old versions are refused, upgrade the agent (%v)", best, d.cfg.MinProtocol, nerr)
}
