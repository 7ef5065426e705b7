package daemon

import (
	agentwire "forgeyard.dev/transport/wire/agent"
)

// sendServerTime sends ServerTimeV1 (§146–147): the daemon's clock, for
// the agent's deadline conversion (it judges lease and secret expiries on
// the daemon's clock) and diagnostics. Sent once a session becomes active
// — after the resync answer, or at registration for roles without leases —
// besides the server time in HelloAckV1, RegistrationAcceptedV1 and every
// HeartbeatAckV1. The daemon never uses a peer's time for authority.
//
// The session's restart token (restarttoken.go) goes with it: both are
// sent once, when the session becomes active.
func (c *conn) sendServerTime() {
	if ch := c.channel(); ch != nil {
		_, _ = ch.SendMsg(&agentwire.ServerTimeV1{ServerTimeMs: uint64(c.d.now().UnixMilli())})
	}
	c.sendRestartToken()
}
