package session

import (
	"fmt"
	"slices"

	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wcas "forgeyard.dev/transport/wire/cas"
)

// DaemonMaySend reports whether the daemon may send a message of type t to
// a peer of role (§98, §191–192): the direction table registers t as sent
// by the daemon (a type it does not name is never daemon-sendable), and the
// role table allows t for role (Allowed). This is the registration of
// daemon-sendable types: adding a daemon → peer message means adding it to
// the direction table with FromDaemon, in a family the peer's role allows.
func DaemonMaySend(role agentwire.PeerRole, t wire.MessageTypeId) bool {
	d, ok := directions[t]
	return ok && d&FromDaemon != 0 && (Allowed(role, t) || slices.Contains(roleSendExtras[role], t))
}

// roleSendExtras are the daemon-sent types a role gets outside its
// classes: a device agent downloads the artifact of an install in flight
// from the daemon's CAS (§100), so it is sent the download's stream header
// and, for a refused download, the CAS answer (CasObjectAck Forbidden);
// the daemon serves nothing else of CAS to it (data.go).
var roleSendExtras = map[agentwire.PeerRole][]wire.MessageTypeId{
	agentwire.RoleDeviceAgent: {wcas.MsgCasObjectStreamHeader, wcas.MsgCasObjectAck},
}

// RoleSendExtras returns the daemon-sent types role gets outside its
// classes (a copy).
func RoleSendExtras(role agentwire.PeerRole) []wire.MessageTypeId {
	return slices.Clone(roleSendExtras[role])
}

// DaemonMaySendBeforeHello reports whether the daemon may send t before the
// peer's hello named its role: a session or common type the daemon sends
// (HelloAckV1, RegistrationRejectedV1, WireErrorV1, …).
func DaemonMaySendBeforeHello(t wire.MessageTypeId) bool {
	d, ok := directions[t]
	if !ok || d&FromDaemon == 0 {
		return false
	}
	c := Classify(t)
	return c == ClassSession || c == ClassCommon
}

// DaemonSendable lists, in type order, every type the daemon may send to a
// peer of role (DaemonMaySend).
func DaemonSendable(role agentwire.PeerRole) []wire.MessageTypeId {
	var out []wire.MessageTypeId
	for t := range directions {
		if DaemonMaySend(role, t) {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out
}

// NotSendableError is the daemon's refusal to send a type that is not
// registered as daemon-sendable for the peer's role.
type NotSendableError struct {
	Role  agentwire.PeerRole
	Type  wire.MessageTypeId
	Hello bool // false: before the hello (role unknown)
}

// Error names the type and the role.
func (e *NotSendableError) Error() string {
	if !e.Hello {
		return fmt.Sprintf("session: message type %s is not daemon-sendable before the hello", e.Type)
	}
	return fmt.Sprintf("session: message type %s is not daemon-sendable to role %s", e.Type, e.Role)
}
