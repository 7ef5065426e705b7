package daemon_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/session"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/admin"
	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/registry"
)

// TestSendPathRefusesUnregisteredTypes (§98, §191–192): the daemon's send
// path lets out only the types the session tables register as
// daemon-sendable for the peer's role. Every registered sample type is
// sent to a raw execution agent through the ordinary control-channel send:
// the types session.DaemonMaySend does not allow fail with a
// *semantics.SendRefusedError wrapping *session.NotSendableError and never
// reach the peer; the allowed ones arrive.
func TestSendPathRefusesUnregisteredTypes(t *testing.T) {
	enginetest.AllBackends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		rc := w.DialRaw(id)
		rc.Join(wire.NewAgentSessionId())
		w.AwaitActive(id.Runner)
		before := w.D.Stats().SendRefused
		refused, sent := 0, 0
		want := map[wire.MessageTypeId]int{}
		for _, m := range registry.Samples() {
			typ := m.MessageType()
			err := daemon.SendToRunner(w.D, id.Runner, m)
			if session.DaemonMaySend(agentwire.RoleAgent, typ) {
				if err != nil {
					t.Errorf("%s: sendable type refused: %v", typ, err)
				}
				sent++
				want[typ]++
				continue
			}
			var sre *semantics.SendRefusedError
			var nse *session.NotSendableError
			if !errors.As(err, &sre) || !errors.As(err, &nse) || sre.Type != typ || nse.Role != agentwire.RoleAgent {
				t.Errorf("%s: not daemon-sendable to an agent, but Send returned %v", typ, err)
			}
			refused++
		}
		if refused == 0 || sent == 0 {
			t.Fatalf("refused %d, sent %d: the sweep is vacuous", refused, sent)
		}
		if got := w.D.Stats().SendRefused - before; got != int64(refused) {
			t.Errorf("Stats.SendRefused grew by %d, want %d", got, refused)
		}
		// A marker after the sweep: everything before it has arrived, and
		// nothing refused is among it.
		if err := daemon.SendToRunner(w.D, id.Runner, &admin.ResumeV1{}); err != nil {
			t.Fatal(err)
		}
		got := map[wire.MessageTypeId]int{}
		deadline := time.After(10 * time.Second)
		for {
			var e *wire.Envelope
			select {
			case e = <-rc.In:
			case <-deadline:
				t.Fatalf("the marker never arrived; received %v", got)
			}
			typ := e.Payload.MessageType()
			if typ == admin.MsgResume && got[admin.MsgResume] == want[admin.MsgResume] {
				break
			}
			got[typ]++
		}
		for typ, n := range got {
			if !session.DaemonMaySend(agentwire.RoleAgent, typ) {
				t.Errorf("peer received %d × %s, which is not daemon-sendable to an agent", n, typ)
			}
		}
		for typ, n := range want {
			if got[typ] < n {
				t.Errorf("peer received %d × %s, want %d", got[typ], typ, n)
			}
		}
	})
}

// TestSendPathRoleTables: what the send path allows each role is derived
// from the role table, so a device agent is never sent execution or
// signing messages, a signing worker never execution or device messages,
// and an execution agent neither family.
func TestSendPathRoleTables(t *testing.T) {
	for _, tc := range []struct {
		role   agentwire.PeerRole
		forbid []wire.Family
	}{
		{agentwire.RoleAgent, []wire.Family{wire.FamilySigning, wire.FamilyDevice}},
		{agentwire.RoleInternalWorker, []wire.Family{wire.FamilySigning, wire.FamilyDevice}},
		{agentwire.RoleSigningWorker, []wire.Family{wire.FamilyLogs, wire.FamilyCas, wire.FamilyDevice}},
		{agentwire.RoleDeviceAgent, []wire.Family{wire.FamilyLogs, wire.FamilyCas, wire.FamilySigning}},
	} {
		for _, typ := range session.DaemonSendable(tc.role) {
			if slices.Contains(session.RoleSendExtras(tc.role), typ) {
				// A device agent's artifact download (header, refusal):
				// the only CAS it is sent.
				continue
			}
			for _, f := range tc.forbid {
				if typ.Family() == f {
					t.Errorf("%s may be sent %s", tc.role, typ)
				}
			}
			if session.Classify(typ) == session.ClassExecution && tc.role != agentwire.RoleAgent && tc.role != agentwire.RoleInternalWorker {
				t.Errorf("%s may be sent execution message %s", tc.role, typ)
			}
		}
	}
	if got := session.RoleSendExtras(agentwire.RoleDeviceAgent); len(got) != 2 {
		t.Errorf("device agent extras %v, want the CAS download header and answer only", got)
	}
	if session.DaemonMaySend(agentwire.RoleAgent, agentwire.MsgLeaseAccepted) {
		t.Error("an agent-sent type is daemon-sendable")
	}
	if session.DaemonMaySendBeforeHello(agentwire.MsgLeaseOffer) || !session.DaemonMaySendBeforeHello(agentwire.MsgHelloAck) {
		t.Error("before the hello only session and common types may be sent")
	}
}
