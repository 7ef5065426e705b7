package daemon

import (
	"context"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/admin"
)

// onRunnerEvent acts on a drain or resume another daemon recorded
// (authority.EventRunner, delivered by the Watcher within milliseconds):
// it is sent to the runner's agent here (the drain's reason read from the
// inventory). A disable or a revoked certificate takes the revocation
// re-check instead (runnerChanged, revocation.go), which closes the
// transports with CloseRunnerDisabled or AuthenticationFailure. Without the
// event (SQLite, the LISTEN connection down) the agent learns the drain
// when it reconnects and the disable at the next revocation poll or
// registration, as before.
func (d *Daemon) onRunnerEvent(ev authority.Event) {
	conns := d.runnerConns(ev.Runner)
	if len(conns) == 0 {
		return
	}
	d.drainMu.Lock()
	defer d.drainMu.Unlock()
	switch ev.Reason {
	case authority.RunnerEventDrained:
		ctx, cancel := context.WithTimeout(d.ctx, d.timing.RequestTimeout)
		st, err := d.drainState(ctx, ev.Runner)
		cancel()
		if err != nil {
			d.authorityFailed("drain_state", err, "runner", ev.Runner.String())
			return
		}
		if st.Drained {
			_ = d.sendRunner(ev.Runner, &admin.DrainV1{Reason: wire.TruncateUTF8(st.Reason, admin.MaxText)})
		}
	case authority.RunnerEventResumed:
		_ = d.sendRunner(ev.Runner, &admin.ResumeV1{})
	}
}
