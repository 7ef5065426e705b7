package daemon

import (
	"context"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/admin"
)

// onRunnerEvent acts on a runner's state change another daemon recorded
// (authority.EventRunner, delivered by the Watcher within milliseconds):
// a disabled runner's transports here are closed with CloseRunnerDisabled
// (as DisableRunner closes them on the daemon it ran on); a drain or a
// resume is sent to its agent here (the drain's reason read from the
// inventory). Without the event (SQLite, the LISTEN connection down) the
// agent learns the drain when it reconnects and the disable at its next
// registration, as before.
func (d *Daemon) onRunnerEvent(ev authority.Event) {
	conns := d.runnerConns(ev.Runner)
	if len(conns) == 0 {
		return
	}
	switch ev.Reason {
	case authority.RunnerEventDisabled:
		for _, c := range conns {
			c.closeNow(wire.CloseRunnerDisabled, "runner disabled")
		}
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
