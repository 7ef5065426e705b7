package daemon

import (
	"forgeyard.dev/transport/semantics/session"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// roleUnknown is conn.sendRole before the peer's hello.
const roleUnknown = -1

// roleUnchecked is conn.sendRole while a test sends a peer what the
// daemon never sends it, to test the peer's own refusal
// (export_roles_test.go CallRunner); nothing else sets it.
const roleUnchecked = -2

// CheckSend (semantics.SendChecker) is the one check every envelope the daemon writes to a peer
// passes (semantics.Config.SendCheck: the control stream, data-plane
// answers, secrets): the type must be registered as daemon-sendable for the
// peer's role in the session package's direction and role tables
// (session.DaemonMaySend; before the hello only session and common types,
// session.DaemonMaySendBeforeHello). "No remote shell" (§98) is thus
// enforced where messages leave, not only by a test: a type the tables do
// not register fails here and nothing is written.
func (c *conn) CheckSend(t wire.MessageTypeId) error {
	r := c.sendRole.Load()
	if r == roleUnchecked {
		return nil
	}
	if r == roleUnknown {
		if session.DaemonMaySendBeforeHello(t) {
			return nil
		}
		c.d.st.sendRefused.Add(1)
		return &session.NotSendableError{Type: t}
	}
	role := agentwire.PeerRole(r)
	if session.DaemonMaySend(role, t) {
		return nil
	}
	c.d.st.sendRefused.Add(1)
	return &session.NotSendableError{Role: role, Type: t, Hello: true}
}

// sentTypes is every type the daemon may send to a peer of any role,
// derived from the session tables (session.DaemonSendable).
func sentTypes() []wire.MessageTypeId {
	seen := map[wire.MessageTypeId]bool{}
	var out []wire.MessageTypeId
	for _, role := range []agentwire.PeerRole{agentwire.RoleAgent, agentwire.RoleDeviceAgent, agentwire.RoleSigningWorker, agentwire.RoleInternalWorker} {
		for _, t := range session.DaemonSendable(role) {
			if !seen[t] {
				seen[t] = true
				out = append(out, t)
			}
		}
	}
	return out
}
