package daemon_test

import (
	"reflect"
	"regexp"
	"testing"

	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/session"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wcas "forgeyard.dev/transport/wire/cas"
	"forgeyard.dev/transport/wire/health"
	wlogs "forgeyard.dev/transport/wire/logs"
	"forgeyard.dev/transport/wire/registry"
	"forgeyard.dev/transport/wire/signing"
)

// shellLike matches field names that could carry something to run.
var shellLike = regexp.MustCompile(`(?i)command|cmd|shell|script|exec|argv|args|env|program|binary|entrypoint`)

// TestDaemonCannotSendArbitraryCommand (§98): every message type the daemon
// can send — for each peer role, the types the session tables register as
// daemon-sendable, which is what the send path enforces (send.go) — is a
// typed session/lease/admin/health/common type (or, for the signing worker
// and the device agent alone, their own typed request families) the peer
// expects from a daemon, and no field anywhere in it (recursively) is
// shaped like a command, script or environment.
func TestDaemonCannotSendArbitraryCommand(t *testing.T) {
	samples := map[wire.MessageTypeId]wire.Message{}
	for _, m := range registry.Samples() {
		samples[m.MessageType()] = m
	}
	if len(daemon.SentTypes) < 10 {
		t.Fatalf("SentTypes lists only %d types", len(daemon.SentTypes))
	}
	union := map[wire.MessageTypeId]bool{}
	for _, role := range []agentwire.PeerRole{agentwire.RoleAgent, agentwire.RoleDeviceAgent, agentwire.RoleSigningWorker, agentwire.RoleInternalWorker} {
		for _, typ := range session.DaemonSendable(role) {
			union[typ] = true
			mi, ok := registry.Default.Lookup(typ)
			if !ok {
				t.Fatalf("%s not registered", typ)
			}
			switch typ.Family() {
			case wire.FamilyAgent, wire.FamilyAdmin, wire.FamilyCommon:
			case wire.FamilyHealth:
				if typ != health.MsgProbeRequest && typ != health.MsgProbeResponse {
					t.Errorf("%s: daemon sends health message other than a probe request or result", mi.Name)
				}
			case wire.FamilySigning:
				if role != agentwire.RoleSigningWorker || typ != signing.MsgSignRequest {
					t.Errorf("%s: daemon sends signing message to %s", mi.Name, role)
				}
			case wire.FamilyDevice:
				if role != agentwire.RoleDeviceAgent {
					t.Errorf("%s: daemon sends device message to %s", mi.Name, role)
				}
			case wire.FamilyLogs, wire.FamilyCas:
				// Only the data plane's acknowledgements, answers and
				// download headers: they carry sequence numbers, offsets and
				// object references, nothing to run.
				switch typ {
				case wlogs.MsgLogAck, wlogs.MsgLogResumeRequest, wlogs.MsgLogsFinalizedAck, wcas.MsgMissingObjects,
					wcas.MsgCasObjectAck, wcas.MsgCasObjectStreamHeader, wcas.MsgCasRangeResumeRequest:
				default:
					t.Errorf("%s: daemon sends data-plane message", mi.Name)
				}
			default:
				t.Errorf("%s: daemon sends family %s", mi.Name, typ.Family())
			}
			if session.DirectionOf(typ)&session.FromDaemon == 0 {
				t.Errorf("%s is not a daemon → agent message", mi.Name)
			}
			m := samples[typ]
			if m == nil {
				m = mi.New()
			}
			walkFields(t, mi.Name, reflect.TypeOf(m), map[reflect.Type]bool{})
		}
	}
	for _, typ := range daemon.SentTypes {
		if !union[typ] {
			t.Errorf("SentTypes names %s, which no role may be sent", typ)
		}
		delete(union, typ)
	}
	for typ := range union {
		t.Errorf("SentTypes misses %s", typ)
	}
}

func walkFields(t *testing.T, path string, ty reflect.Type, seen map[reflect.Type]bool) {
	for ty.Kind() == reflect.Pointer || ty.Kind() == reflect.Slice || ty.Kind() == reflect.Array {
		ty = ty.Elem()
	}
	if ty.Kind() != reflect.Struct || seen[ty] {
		return
	}
	seen[ty] = true
	for i := 0; i < ty.NumField(); i++ {
		f := ty.Field(i)
		if shellLike.MatchString(f.Name) {
			t.Errorf("%s.%s looks like a command field", path, f.Name)
		}
		walkFields(t, path+"."+f.Name, f.Type, seen)
	}
}

// TestShellLikeCatches proves the check is not vacuous.
func TestShellLikeCatches(t *testing.T) {
	for _, n := range []string{"Command", "ShellScript", "Argv", "Env"} {
		if !shellLike.MatchString(n) {
			t.Errorf("%s not caught", n)
		}
	}
	if shellLike.MatchString("Reason") || shellLike.MatchString("DeadlineMs") {
		t.Error("ordinary field caught")
	}
}
