package daemon

import (
	"context"
	"crypto/rand"
	"math/big"

	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/admin"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// DrainRunner stops offering leases to runner and sends admin DrainV1 to
// its transports (§97). With an authority inventory the drain is stored
// there, so every daemon sharing the authority refuses offers to the
// runner and re-sends the drain when it reconnects to them; it is audited
// (runner.admin_command, reason drain). It returns ErrNotConnected if none
// is connected to this daemon (the drain is still recorded).
func (d *Daemon) DrainRunner(ctx context.Context, runner wire.RunnerId, reason string) error {
	reason = wire.TruncateUTF8(reason, admin.MaxText)
	d.drainMu.Lock()
	err := d.storeDrain(ctx, runner, true, reason)
	if err == nil {
		err = d.sendRunner(runner, &admin.DrainV1{Reason: reason})
	}
	d.drainMu.Unlock()
	d.adminAudit(ctx, runner, telemetry.ReasonAdminDrain, err)
	return err
}

// ResumeRunner ends a drain (here and in the authority inventory) and
// sends admin ResumeV1; audited like DrainRunner.
func (d *Daemon) ResumeRunner(ctx context.Context, runner wire.RunnerId) error {
	d.drainMu.Lock()
	err := d.storeDrain(ctx, runner, false, "")
	if err == nil {
		err = d.sendRunner(runner, &admin.ResumeV1{})
	}
	d.drainMu.Unlock()
	d.adminAudit(ctx, runner, telemetry.ReasonAdminResume, err)
	return err
}

// storeDrain records the drain state: in the authority's inventory, the
// one source of truth for every daemon sharing it, or, without one, in
// this daemon's memory.
func (d *Daemon) storeDrain(ctx context.Context, runner wire.RunnerId, drained bool, reason string) error {
	if inv := d.inventory(); inv != nil {
		return inv.SetDrain(ctx, runner, drained, reason, d.now())
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if drained {
		d.drained[runner] = reason
	} else {
		delete(d.drained, runner)
	}
	return nil
}

func (d *Daemon) sendRunner(runner wire.RunnerId, m wire.Message) error {
	n := 0
	for _, c := range d.runnerConns(runner) {
		if ch := c.channel(); ch != nil && c.registered() {
			if _, err := ch.SendMsg(m); err == nil {
				n++
				if _, drain := m.(*admin.DrainV1); drain {
					c.markDrainSent(true)
				} else if _, resume := m.(*admin.ResumeV1); resume {
					c.markDrainSent(false)
				}
			}
		}
	}
	if n == 0 {
		return ErrNotConnected
	}
	return nil
}

func (d *Daemon) runnerConns(runner wire.RunnerId) []*conn {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*conn, 0, len(d.byRunner[runner]))
	for c := range d.byRunner[runner] {
		out = append(out, c)
	}
	return out
}

// DisableRunner disables (revokes) the runner in the authority — its
// sessions end and its live leases are revoked — and closes its transports
// on this daemon with CloseRunnerDisabled.
func (d *Daemon) DisableRunner(ctx context.Context, runner wire.RunnerId, reason string) error {
	if err := d.auth.SetRunnerEnabled(ctx, runner, false, reason, d.now()); err != nil {
		return err
	}
	// The operator's reason is free text: it stays in the authority, not
	// in the audit record.
	d.audit.Emit(ctx, telemetry.EventRunnerRevoked, telemetry.Runner(runner), telemetry.Code(wire.ErrCodeRunnerDisabled),
		telemetry.Reason(telemetry.ReasonRevoked))
	for _, c := range d.runnerConns(runner) {
		c.closeNow(wire.CloseRunnerDisabled, "runner disabled: "+reason)
	}
	return nil
}

// Shutdown refuses new connections, sends GoAwayV1{CloseShutdown} to every agent
// (reconnect_in jittered per agent, alternate endpoints), waits for the
// agents to leave or ctx, then closes the rest with CloseShutdown and stops
// the background loops. It returns ctx's error if agents were still
// connected when ctx ended.
func (d *Daemon) Shutdown(ctx context.Context) error {
	d.mu.Lock()
	d.shutdown = true
	ls := d.listeners
	d.listeners = nil
	conns := make([]*conn, 0, len(d.conns))
	for _, c := range d.conns {
		conns = append(conns, c)
	}
	d.mu.Unlock()
	// Listeners close last: closing a QUIC listener ends the connections
	// accepted from it, and the agents must read their GoAway first. New
	// connections meanwhile are refused by newConn.
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	tryFor := uint32(d.timing.MaxBackoff.Milliseconds())
	for _, c := range conns {
		ch := c.channel()
		if ch == nil || !c.registered() {
			c.closeNow(wire.CloseShutdown, "daemon shutting down")
			continue
		}
		c.setState(stateDraining)
		j, _ := rand.Int(rand.Reader, big.NewInt(max(1, d.timing.HeartbeatInterval.Milliseconds())))
		_, _ = ch.SendMsg(&agentwire.GoAwayV1{Code: wire.CloseShutdown, ReconnectInMs: uint32(j.Int64()) + 1,
			TryForMs: tryFor, AlternateEndpoints: d.cfg.AlternateEndpoints, Message: "daemon shutting down"})
	}
	var err error
	for _, c := range conns {
		select {
		case <-c.done:
		case <-ctx.Done():
			err = ctx.Err()
		}
		if err != nil {
			break
		}
	}
	for _, c := range conns {
		c.closeNow(wire.CloseShutdown, "daemon shutting down")
	}
	d.cancel()
	d.wg.Wait()
	if d.ownSink != nil {
		_ = d.ownSink.Close()
	}
	return err
}
