package agent

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/maxsize"
)

var maxHeartbeatSize = 2*maxsize.ID + maxsize.U64 +
	maxsize.Seq(MaxActiveAttempts, attemptPhaseMaxSize) + maxsize.Digest +
	maxsize.U32 + 2*maxsize.U64 + maxsize.U16

// Messages lists every V1 message of the agent family, for wire.NewRegistry.
// MaxSize is the largest canonical encoding of the message body that the
// decoder accepts, derived from the field bounds (every varint at its widest,
// every string and sequence at its bound); TestMaxSize checks maximal values
// against it. SecretMaterialV1 and CertificateRequestV1 (it carries the
// enrollment token) are Sensitive. Callers must not modify
// the slice.
var Messages = []wire.MessageInfo{
	{Type: MsgTransportHello, Name: nameTransportHello, Since: wire.V(1, 0), MaxSize: maxTransportHelloSize,
		New: func() wire.Message { return new(TransportHelloV1) }},
	{Type: MsgHelloAck, Name: nameHelloAck, Since: wire.V(1, 0), MaxSize: maxHelloAckSize,
		New: func() wire.Message { return new(HelloAckV1) }},
	{Type: MsgRegisterAgent, Name: nameRegisterAgent, Since: wire.V(1, 0), MaxSize: maxRegisterAgentSize,
		New: func() wire.Message { return new(RegisterAgentV1) }},
	{Type: MsgRegistrationAccepted, Name: nameRegistrationAccepted, Since: wire.V(1, 0), MaxSize: maxRegistrationAcceptedSize,
		New: func() wire.Message { return new(RegistrationAcceptedV1) }},
	{Type: MsgRegistrationRejected, Name: nameRegistrationRejected, Since: wire.V(1, 0), MaxSize: maxRegistrationRejectedSize,
		New: func() wire.Message { return new(RegistrationRejectedV1) }},
	{Type: MsgLeaseOffer, Name: nameLeaseOffer, Since: wire.V(1, 0), MaxSize: maxLeaseOfferSize,
		New: func() wire.Message { return new(LeaseOfferV1) }},
	{Type: MsgLeaseAccepted, Name: nameLeaseAccepted, Since: wire.V(1, 0), MaxSize: maxLeaseAcceptedSize,
		New: func() wire.Message { return new(LeaseAcceptedV1) }},
	{Type: MsgLeaseRejected, Name: nameLeaseRejected, Since: wire.V(1, 0), MaxSize: noteMaxSize,
		New: func() wire.Message { return new(LeaseRejectedV1) }},
	{Type: MsgLeaseRenew, Name: nameLeaseRenew, Since: wire.V(1, 0), MaxSize: maxLeaseRenewSize,
		New: func() wire.Message { return new(LeaseRenewV1) }},
	{Type: MsgLeaseRenewAck, Name: nameLeaseRenewAck, Since: wire.V(1, 0), MaxSize: maxLeaseRenewAckSize,
		New: func() wire.Message { return new(LeaseRenewAckV1) }},
	{Type: MsgCancelAttempt, Name: nameCancelAttempt, Since: wire.V(1, 0), MaxSize: noteMaxSize,
		New: func() wire.Message { return new(CancelAttemptV1) }},
	{Type: MsgCancelAck, Name: nameCancelAck, Since: wire.V(1, 0), MaxSize: maxCancelAckSize,
		New: func() wire.Message { return new(CancelAckV1) }},
	{Type: MsgPhaseChange, Name: namePhaseChange, Since: wire.V(1, 0), MaxSize: attemptPhaseMaxSize,
		New: func() wire.Message { return new(PhaseChangeV1) }},
	{Type: MsgAttemptCompletion, Name: nameAttemptCompletion, Since: wire.V(1, 0), MaxSize: maxAttemptCompletionSize,
		New: func() wire.Message { return new(AttemptCompletionV1) }},
	{Type: MsgCompletionAck, Name: nameCompletionAck, Since: wire.V(1, 0), MaxSize: noteMaxSize,
		New: func() wire.Message { return new(CompletionAckV1) }},
	{Type: MsgHeartbeat, Name: "agent.HeartbeatV1", Since: wire.V(1, 0), MaxSize: maxHeartbeatSize,
		New: func() wire.Message { return new(HeartbeatV1) }},
	{Type: MsgHeartbeatAck, Name: nameHeartbeatAck, Since: wire.V(1, 0), MaxSize: maxHeartbeatAckSize,
		New: func() wire.Message { return new(HeartbeatAckV1) }},
	{Type: MsgAgentResync, Name: nameAgentResync, Since: wire.V(1, 0), MaxSize: maxAgentResyncSize,
		New: func() wire.Message { return new(AgentResyncV1) }},
	{Type: MsgResyncResponse, Name: nameResyncResponse, Since: wire.V(1, 0), MaxSize: maxResyncResponseSize,
		New: func() wire.Message { return new(ResyncResponseV1) }},
	{Type: MsgCapabilityUpdate, Name: nameCapabilityUpdate, Since: wire.V(1, 0), MaxSize: maxCapabilityUpdateSize,
		New: func() wire.Message { return new(CapabilityUpdateV1) }},
	{Type: MsgGoAway, Name: nameGoAway, Since: wire.V(1, 0), MaxSize: maxGoAwaySize,
		New: func() wire.Message { return new(GoAwayV1) }},
	{Type: MsgServerTime, Name: nameServerTime, Since: wire.V(1, 0), MaxSize: maxServerTimeSize,
		New: func() wire.Message { return new(ServerTimeV1) }},
	{Type: MsgSessionFenced, Name: nameSessionFenced, Since: wire.V(1, 0), MaxSize: maxSessionFencedSize,
		New: func() wire.Message { return new(SessionFencedV1) }},
	{Type: MsgLeaseProbe, Name: nameLeaseProbe, Since: wire.V(1, 0), MaxSize: maxLeaseProbeSize,
		New: func() wire.Message { return new(LeaseProbeV1) }},
	{Type: MsgSecretMaterial, Name: nameSecretMaterial, Since: wire.V(1, 0), MaxSize: maxSecretMaterialSize,
		Sensitive: true, New: func() wire.Message { return new(SecretMaterialV1) }},
	{Type: MsgCertificateRequest, Name: nameCertificateRequest, Since: wire.V(1, 2), MaxSize: maxCertificateRequestSize,
		Sensitive: true, New: func() wire.Message { return new(CertificateRequestV1) }},
	{Type: MsgCertificateIssued, Name: nameCertificateIssued, Since: wire.V(1, 2), MaxSize: maxCertificateIssuedSize,
		New: func() wire.Message { return new(CertificateIssuedV1) }},
	{Type: MsgRegistrationDeferred, Name: nameRegistrationDeferred, Since: wire.V(1, 2), MaxSize: maxRegistrationDeferredSize,
		New: func() wire.Message { return new(RegistrationDeferredV1) }},
	{Type: MsgRestartToken, Name: nameRestartToken, Since: wire.V(1, 3), MaxSize: maxRestartTokenSize,
		New: func() wire.Message { return new(RestartTokenV1) }},
}
