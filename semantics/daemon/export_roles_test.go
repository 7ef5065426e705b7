package daemon

import (
	"context"

	"forgeyard.dev/transport/wire"
)

// CallRunner sends m to runner's newest transport on this daemon and
// returns the correlated answer (a WireErrorV1 answer is the error), as
// if the daemon had a reason to send it. Test-only: the roles tests use it
// to send a peer what the daemon's API never sends it.
func CallRunner(ctx context.Context, d *Daemon, runner wire.RunnerId, m wire.Message) (*wire.Envelope, error) {
	c := d.runnerConn(runner)
	if c == nil {
		return nil, ErrNotConnected
	}
	return c.call(ctx, m)
}
