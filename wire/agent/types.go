// Package agent holds the V1 agent-control protocol family (§41): the
// messages of the long-lived control stream between daemon and agent.
//
// Every message is a wire type, distinct from the domain types that
// semantics/ builds from it after Validate (§34, §260). Type numbers are
// explicit and stable (§159–160): never renumber, never reuse.
package agent

import "forgeyard.dev/transport/wire"

// Alike in shape to the other families' id, type-number list and errInvalid,
// but each is its own family's frozen numbering and error prefix (API).
func id(v uint8) wire.MessageTypeId { return wire.TypeID(wire.FamilyAgent, v) }

// Message type numbers of the agent family (family 1).
var (
	MsgTransportHello       = id(0x01)
	MsgHelloAck             = id(0x02)
	MsgRegisterAgent        = id(0x03)
	MsgRegistrationAccepted = id(0x04)
	MsgRegistrationRejected = id(0x05)
	MsgLeaseOffer           = id(0x06)
	MsgLeaseAccepted        = id(0x07)
	MsgLeaseRejected        = id(0x08)
	MsgLeaseRenew           = id(0x09)
	MsgLeaseRenewAck        = id(0x0a)
	MsgCancelAttempt        = id(0x0b)
	MsgCancelAck            = id(0x0c)
	MsgPhaseChange          = id(0x0d)
	MsgAttemptCompletion    = id(0x0e)
	MsgCompletionAck        = id(0x0f)
	MsgHeartbeat            = id(0x10)
	MsgHeartbeatAck         = id(0x11)
	MsgAgentResync          = id(0x12)
	MsgResyncResponse       = id(0x13)
	MsgCapabilityUpdate     = id(0x14)
	MsgGoAway               = id(0x15)
	MsgServerTime           = id(0x16)
	MsgSessionFenced        = id(0x17)
	MsgLeaseProbe           = id(0x18)
	MsgSecretMaterial       = id(0x19)
)
