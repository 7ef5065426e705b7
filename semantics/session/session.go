// Package session holds the rules of an agent control session that both
// ends share: the daemon-side state machine (§57, §186–190), the role →
// message-family table (§191–192), message directions, and the
// registration key proof that binds a registration to the agent's
// certificate key (so a relay that carries the bytes cannot register as
// the runner).
//
// Everything here is pure and safe for concurrent use; the daemon and
// agent packages apply it.
package session

import (
	"log/slog"
	"strconv"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/admin"
	agentwire "forgeyard.dev/transport/wire/agent"
	wcas "forgeyard.dev/transport/wire/cas"
	"forgeyard.dev/transport/wire/device"
	"forgeyard.dev/transport/wire/health"
	wlogs "forgeyard.dev/transport/wire/logs"
	"forgeyard.dev/transport/wire/signing"
)

// State is the daemon-side state of one transport's control session.
// States only move forward.
type State uint8

// Session states (§57, §189).
const (
	Connected  State = iota // transport up, no hello yet
	Negotiated              // hello answered; waiting for RegisterAgentV1
	Registered              // registration accepted; waiting for AgentResyncV1
	Active                  // resynced: every message of the role is legal
	Draining                // shutdown announced (GoAway sent); no new leases
	Closing                 // close decided; messages are ignored
	Closed                  // transport gone
)

var stateNames = [...]string{"Connected", "Negotiated", "Registered", "Active", "Draining", "Closing", "Closed"}

// String returns the state name.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (s State) LogValue() slog.Value { return slog.StringValue(s.String()) }

// Class groups message types for the role table.
type Class uint8

// Message classes.
const (
	ClassUnknown   Class = iota // not a type this build knows
	ClassCommon                 // WireErrorV1: legal for everyone
	ClassSession                // hello, ack, register, accepted/rejected, heartbeat+ack, goaway, server time, fenced, restart token
	ClassExecution              // lease*, cancel*, phase, completion*, resync, capability update, probe, secret; logs and CAS
	ClassAdmin                  // typed admin commands (daemon → agent) and their ack
	ClassHealth                 // health probes
	ClassSigning                // signing-worker family
	ClassDevice                 // device-agent family
)

var classNames = [...]string{"unknown", "common", "session", "execution", "admin", "health", "signing", "device"}

// String returns the class name.
func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return "Class(" + strconv.Itoa(int(c)) + ")"
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (c Class) LogValue() slog.Value { return slog.StringValue(c.String()) }

var sessionTypes = map[wire.MessageTypeId]bool{
	agentwire.MsgTransportHello: true, agentwire.MsgHelloAck: true,
	agentwire.MsgRegisterAgent: true, agentwire.MsgRegistrationAccepted: true, agentwire.MsgRegistrationRejected: true,
	agentwire.MsgHeartbeat: true, agentwire.MsgHeartbeatAck: true,
	agentwire.MsgGoAway: true, agentwire.MsgServerTime: true, agentwire.MsgSessionFenced: true,
	agentwire.MsgCertificateRequest: true, agentwire.MsgCertificateIssued: true, agentwire.MsgRegistrationDeferred: true,
	agentwire.MsgRestartToken: true,
}

// Classify returns the class of t.
func Classify(t wire.MessageTypeId) Class {
	switch t.Family() {
	case wire.FamilyCommon:
		return ClassCommon
	case wire.FamilyAgent:
		if sessionTypes[t] {
			return ClassSession
		}
		return ClassExecution
	case wire.FamilyLogs, wire.FamilyCas:
		return ClassExecution
	case wire.FamilyAdmin:
		return ClassAdmin
	case wire.FamilyHealth:
		return ClassHealth
	case wire.FamilySigning:
		return ClassSigning
	case wire.FamilyDevice:
		return ClassDevice
	}
	return ClassUnknown
}

// roleClasses is the role → allowed classes table (§191–192). Common,
// session, admin and health messages are legal for every role.
var roleClasses = map[agentwire.PeerRole][]Class{
	agentwire.RoleAgent:          {ClassExecution},
	agentwire.RoleDeviceAgent:    {ClassDevice},
	agentwire.RoleSigningWorker:  {ClassSigning},
	agentwire.RoleInternalWorker: {ClassExecution},
}

// Allowed reports whether a peer of role may exchange messages of type t.
// Session, common, admin and health messages are legal for every known
// role; execution messages only for Agent and InternalWorker; the signing
// family only for SigningWorker; the device family only for DeviceAgent.
// Unknown roles and unknown types are never allowed.
func Allowed(role agentwire.PeerRole, t wire.MessageTypeId) bool {
	extra, ok := roleClasses[role]
	if !ok {
		return false
	}
	switch c := Classify(t); c {
	case ClassCommon, ClassSession, ClassAdmin, ClassHealth:
		return true
	case ClassUnknown:
		return false
	default:
		for _, e := range extra {
			if e == c {
				return true
			}
		}
		return false
	}
}

// Direction says who may send a message type on the control stream.
type Direction uint8

// Directions.
const (
	FromAgent  Direction = 1 << iota // agent → daemon
	FromDaemon                       // daemon → agent
	Both       = FromAgent | FromDaemon
)

var directions = map[wire.MessageTypeId]Direction{
	agentwire.MsgTransportHello:       FromAgent,
	agentwire.MsgHelloAck:             FromDaemon,
	agentwire.MsgRegisterAgent:        FromAgent,
	agentwire.MsgRegistrationAccepted: FromDaemon,
	agentwire.MsgRegistrationRejected: FromDaemon,
	agentwire.MsgLeaseOffer:           FromDaemon,
	agentwire.MsgLeaseAccepted:        FromAgent,
	agentwire.MsgLeaseRejected:        FromAgent,
	agentwire.MsgLeaseRenew:           FromAgent,
	agentwire.MsgLeaseRenewAck:        FromDaemon,
	agentwire.MsgCancelAttempt:        FromDaemon,
	agentwire.MsgCancelAck:            FromAgent,
	agentwire.MsgPhaseChange:          FromAgent,
	agentwire.MsgAttemptCompletion:    FromAgent,
	agentwire.MsgCompletionAck:        FromDaemon,
	agentwire.MsgHeartbeat:            FromAgent,
	agentwire.MsgHeartbeatAck:         FromDaemon,
	agentwire.MsgAgentResync:          FromAgent,
	agentwire.MsgResyncResponse:       FromDaemon,
	agentwire.MsgCapabilityUpdate:     FromAgent,
	agentwire.MsgGoAway:               FromDaemon,
	agentwire.MsgServerTime:           FromDaemon,
	agentwire.MsgSessionFenced:        FromDaemon,
	agentwire.MsgLeaseProbe:           FromDaemon,
	agentwire.MsgSecretMaterial:       FromDaemon,
	agentwire.MsgCertificateRequest:   FromAgent,
	agentwire.MsgCertificateIssued:    FromDaemon,
	agentwire.MsgRegistrationDeferred: FromDaemon,
	agentwire.MsgRestartToken:         FromDaemon,
	admin.MsgDrain:                    FromDaemon,
	admin.MsgResume:                   FromDaemon,
	admin.MsgRefreshCapabilities:      FromDaemon,
	admin.MsgRunHealthProbe:           FromDaemon,
	admin.MsgAdminAck:                 FromAgent,
	wire.MsgError:                     Both,

	// The data plane (log and CAS streams, and their control-stream
	// barriers).
	wlogs.MsgLogStreamHeader:      FromAgent,
	wlogs.MsgLogFrame:             FromAgent,
	wlogs.MsgLogResumeRequest:     FromDaemon,
	wlogs.MsgLogAck:               FromDaemon,
	wlogs.MsgLogsFinalized:        FromAgent,
	wlogs.MsgLogsFinalizedAck:     FromDaemon,
	wcas.MsgNeedObjects:           FromAgent,
	wcas.MsgMissingObjects:        FromDaemon,
	wcas.MsgCasObjectStreamHeader: Both, // uploads (agent) and downloads (daemon)
	wcas.MsgCasRangeResumeRequest: Both, // the receiver of an upload or download asks to resume
	wcas.MsgCasFetchRequest:       FromAgent,
	wcas.MsgCasObjectAck:          FromDaemon,
	wcas.MsgOutputsFinalized:      FromAgent,

	// Health (§96): the agent reports its summary; either end may ask the
	// other to run a probe, answered with the probe's result.
	health.MsgHealthSummary: FromAgent,
	health.MsgProbeRequest:  Both,
	health.MsgProbeResponse: Both,

	// Signing (§99) and device (§100): the daemon requests, the worker or
	// device agent answers.
	signing.MsgSignRequest:   FromDaemon,
	signing.MsgSignResponse:  FromAgent,
	device.MsgDiscover:       FromDaemon,
	device.MsgDiscoverResult: FromAgent,
	device.MsgReserve:        FromDaemon,
	device.MsgReserveResult:  FromAgent,
	device.MsgInstall:        FromDaemon,
	device.MsgInstallResult:  FromAgent,
	device.MsgRunTest:        FromDaemon,
	device.MsgRunTestResult:  FromAgent,
	device.MsgReset:          FromDaemon,
	device.MsgResetResult:    FromAgent,
}

// DirectionOf returns who may send t; types the direction table does not
// name are Both.
func DirectionOf(t wire.MessageTypeId) Direction {
	if d, ok := directions[t]; ok {
		return d
	}
	return Both
}

// Check decides whether the daemon may act on a message of type t received
// from a peer of role in state st. It returns 0 when the message is legal,
// otherwise the WireErrorV1 code to answer with:
//
//   - a type the daemon sends, or an agent-family message other than the
//     next handshake step: ErrCodeInvalidState;
//   - anything but TransportHelloV1 before the hello, anything but
//     RegisterAgentV1 before registration: ErrCodeNotRegistered;
//   - anything but AgentResyncV1, heartbeats and errors between
//     registration and resync: ErrCodeInvalidState;
//   - a message outside the role's families: ErrCodeRoleForbidden;
//   - anything in Closing/Closed: ErrCodeInvalidState.
//
// role is ignored before the hello (it is not known yet).
func Check(st State, role agentwire.PeerRole, t wire.MessageTypeId) wire.ProtocolErrorCode {
	if DirectionOf(t)&FromAgent == 0 {
		return wire.ErrCodeInvalidState
	}
	switch st {
	case Connected:
		if t == agentwire.MsgTransportHello {
			return 0
		}
		if t == wire.MsgError {
			return 0
		}
		return wire.ErrCodeNotRegistered
	case Negotiated:
		switch t {
		case agentwire.MsgRegisterAgent, wire.MsgError:
			return 0
		case agentwire.MsgTransportHello:
			return wire.ErrCodeInvalidState
		}
		return wire.ErrCodeNotRegistered
	case Registered:
		switch t {
		case agentwire.MsgAgentResync, agentwire.MsgHeartbeat, wire.MsgError:
			return roleCheck(role, t)
		}
		return wire.ErrCodeInvalidState
	case Active, Draining:
		switch t {
		case agentwire.MsgTransportHello, agentwire.MsgRegisterAgent:
			return wire.ErrCodeInvalidState
		}
		return roleCheck(role, t)
	}
	return wire.ErrCodeInvalidState
}

func roleCheck(role agentwire.PeerRole, t wire.MessageTypeId) wire.ProtocolErrorCode {
	if !Allowed(role, t) {
		return wire.ErrCodeRoleForbidden
	}
	return 0
}
