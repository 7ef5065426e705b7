package daemon

import (
	"context"

	"forgeyard.dev/transport/wire"
)

// CallRunner sends m to runner's newest transport on this daemon and
// returns the correlated answer (a WireErrorV1 answer is the error), as
// if the daemon had a reason to send it. Test-only: the roles tests use it
// to send a peer what the daemon's API never sends it (past the send check,
// which refuses it: CheckRunnerSend), to test the peer's own refusal.
func CallRunner(ctx context.Context, d *Daemon, runner wire.RunnerId, m wire.Message) (*wire.Envelope, error) {
	c := d.runnerConn(runner)
	if c == nil {
		return nil, ErrNotConnected
	}
	role := c.sendRole.Swap(roleUnchecked)
	defer c.sendRole.Store(role)
	return c.call(ctx, m)
}

// CheckRunnerSend is the send check of runner's newest transport for t.
func CheckRunnerSend(d *Daemon, runner wire.RunnerId, t wire.MessageTypeId) error {
	c := d.runnerConn(runner)
	if c == nil {
		return ErrNotConnected
	}
	return c.CheckSend(t)
}
