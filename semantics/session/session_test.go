package session_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"testing"

	"forgeyard.dev/transport/semantics/session"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/admin"
	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/device"
	"forgeyard.dev/transport/wire/registry"
	"forgeyard.dev/transport/wire/signing"
)

var executionTypes = []wire.MessageTypeId{
	agentwire.MsgLeaseOffer, agentwire.MsgLeaseAccepted, agentwire.MsgLeaseRejected, agentwire.MsgLeaseRenew,
	agentwire.MsgLeaseRenewAck, agentwire.MsgCancelAttempt, agentwire.MsgCancelAck, agentwire.MsgPhaseChange,
	agentwire.MsgAttemptCompletion, agentwire.MsgCompletionAck, agentwire.MsgAgentResync, agentwire.MsgResyncResponse,
	agentwire.MsgCapabilityUpdate, agentwire.MsgLeaseProbe, agentwire.MsgSecretMaterial,
}

var sessionTypes = []wire.MessageTypeId{
	agentwire.MsgTransportHello, agentwire.MsgHelloAck, agentwire.MsgRegisterAgent, agentwire.MsgRegistrationAccepted,
	agentwire.MsgRegistrationRejected, agentwire.MsgHeartbeat, agentwire.MsgHeartbeatAck, agentwire.MsgGoAway,
	agentwire.MsgServerTime, agentwire.MsgSessionFenced, agentwire.MsgRegistrationDeferred,
}

func TestSigningWorkerRejectsGeneralExecutionMessages(t *testing.T) {
	for _, typ := range executionTypes {
		if session.Allowed(agentwire.RoleSigningWorker, typ) {
			t.Errorf("signing worker allowed %s", typ)
		}
		if code := session.Check(session.Active, agentwire.RoleSigningWorker, typ); code == 0 {
			t.Errorf("Check let a signing worker send %s", typ)
		}
	}
	for _, typ := range []wire.MessageTypeId{signing.MsgSignRequest, signing.MsgSignResponse} {
		if !session.Allowed(agentwire.RoleSigningWorker, typ) {
			t.Errorf("signing worker denied its own family %s", typ)
		}
	}
	for _, typ := range sessionTypes {
		if !session.Allowed(agentwire.RoleSigningWorker, typ) {
			t.Errorf("signing worker denied session message %s", typ)
		}
	}
	if got := session.Check(session.Active, agentwire.RoleSigningWorker, agentwire.MsgLeaseRenew); got != wire.ErrCodeRoleForbidden {
		t.Errorf("renew from signing worker: %s", got)
	}
}

func TestDeviceAgentAcceptsOnlyDeviceProtocolFamily(t *testing.T) {
	for _, mi := range registry.Default.All() {
		typ := mi.Type
		got := session.Allowed(agentwire.RoleDeviceAgent, typ)
		var want bool
		switch session.Classify(typ) {
		case session.ClassDevice, session.ClassSession, session.ClassCommon, session.ClassAdmin, session.ClassHealth:
			want = true
		}
		if got != want {
			t.Errorf("device agent %s (%s): allowed=%v, want %v", mi.Name, session.Classify(typ), got, want)
		}
	}
	if !session.Allowed(agentwire.RoleDeviceAgent, device.MsgRunTest) || session.Allowed(agentwire.RoleAgent, device.MsgRunTest) {
		t.Error("device family must be the device agent's alone")
	}
	if session.Allowed(agentwire.RoleDeviceAgent, signing.MsgSignRequest) {
		t.Error("device agent allowed signing")
	}
}

func TestAgentRoleTable(t *testing.T) {
	for _, typ := range append(executionTypes, sessionTypes...) {
		if !session.Allowed(agentwire.RoleAgent, typ) {
			t.Errorf("agent denied %s", typ)
		}
	}
	if session.Allowed(agentwire.RoleAgent, signing.MsgSignRequest) {
		t.Error("agent allowed signing")
	}
	if session.Allowed(agentwire.PeerRole(99), agentwire.MsgHeartbeat) {
		t.Error("unknown role allowed")
	}
	if session.Allowed(agentwire.RoleAgent, wire.TypeID(wire.Family(9), 1)) {
		t.Error("unknown family allowed")
	}
}

func TestStateMachine(t *testing.T) {
	cases := []struct {
		st   session.State
		typ  wire.MessageTypeId
		want wire.ProtocolErrorCode
	}{
		{session.Connected, agentwire.MsgTransportHello, 0},
		{session.Connected, agentwire.MsgRegisterAgent, wire.ErrCodeNotRegistered},
		{session.Connected, agentwire.MsgLeaseRenew, wire.ErrCodeNotRegistered},
		{session.Negotiated, agentwire.MsgRegisterAgent, 0},
		{session.Negotiated, agentwire.MsgTransportHello, wire.ErrCodeInvalidState},
		{session.Negotiated, agentwire.MsgAttemptCompletion, wire.ErrCodeNotRegistered},
		{session.Registered, agentwire.MsgAgentResync, 0},
		{session.Registered, agentwire.MsgHeartbeat, 0},
		{session.Registered, agentwire.MsgAttemptCompletion, wire.ErrCodeInvalidState},
		{session.Active, agentwire.MsgAttemptCompletion, 0},
		{session.Active, agentwire.MsgRegisterAgent, wire.ErrCodeInvalidState},
		{session.Draining, agentwire.MsgLeaseRenew, 0},
		{session.Active, agentwire.MsgLeaseOffer, wire.ErrCodeInvalidState}, // daemon → agent only
		{session.Active, admin.MsgDrain, wire.ErrCodeInvalidState},
		{session.Active, admin.MsgAdminAck, 0},
		{session.Closing, agentwire.MsgHeartbeat, wire.ErrCodeInvalidState},
	}
	for _, c := range cases {
		if got := session.Check(c.st, agentwire.RoleAgent, c.typ); got != c.want {
			t.Errorf("%s in %s: %v, want %v", c.typ, c.st, got, c.want)
		}
	}
	if session.Closed.String() != "Closed" || session.State(42).String() != "State(42)" {
		t.Error("state names")
	}
}

func TestKeyProof(t *testing.T) {
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	rs, _ := rsa.GenerateKey(rand.Reader, 2048)
	var ch [agentwire.ChallengeSize]byte
	ch[0] = 1
	tr, sess := wire.NewTransportSessionId(), wire.NewAgentSessionId()
	for name, k := range map[string]crypto.Signer{"ecdsa": ec, "ed25519": ed, "rsa": rs} {
		proof, err := session.SignKeyProof(k, ch, tr, sess)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := session.VerifyKeyProof(k.Public(), proof, ch, tr, sess); err != nil {
			t.Errorf("%s: own proof rejected: %v", name, err)
		}
		// Bound to the challenge, the transport and the session.
		ch2 := ch
		ch2[1] = 9
		for what, err := range map[string]error{
			"challenge": session.VerifyKeyProof(k.Public(), proof, ch2, tr, sess),
			"transport": session.VerifyKeyProof(k.Public(), proof, ch, wire.NewTransportSessionId(), sess),
			"session":   session.VerifyKeyProof(k.Public(), proof, ch, tr, wire.NewAgentSessionId()),
			"key":       session.VerifyKeyProof(&rs.PublicKey, []byte("x"), ch, tr, sess),
		} {
			if !errors.Is(err, session.ErrBadKeyProof) {
				t.Errorf("%s: proof accepted with another %s", name, what)
			}
		}
	}
}
