package daemon_test

import (
	"context"
	"crypto"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// auditRecords returns the daemon's audit records (slog "audit" at WARN)
// with event name ev, as decoded JSON objects.
func auditRecords(t *testing.T, w *enginetest.World, ev telemetry.AuditEvent) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(w.LogBuf.String(), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		if rec["msg"] == "audit" && rec["event"] == ev.String() {
			out = append(out, rec)
		}
	}
	return out
}

// awaitAudit waits for the first audit record of ev (the daemon writes it
// on its connection goroutine; the peer's answer may arrive first).
func awaitAudit(t *testing.T, w *enginetest.World, ev telemetry.AuditEvent) map[string]any {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if recs := auditRecords(t, w, ev); len(recs) > 0 {
			return recs[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s audit record in:\n%s", ev, w.LogBuf.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkAudit asserts rec carries exactly the audit keys given (plus the
// slog envelope: time, level, msg, daemon) with those values; "*" means any
// non-empty value. Nothing else — no payload, message text or key — may be
// in an audit record (§212).
func checkAudit(t *testing.T, rec map[string]any, want map[string]string) {
	t.Helper()
	if rec["level"] != "WARN" {
		t.Errorf("audit level %v", rec["level"])
	}
	for k, v := range rec {
		switch k {
		case "time", "level", "msg", "daemon", telemetry.AuditKeyEvent:
			continue
		}
		w, ok := want[k]
		if !ok {
			t.Errorf("unexpected audit attribute %s=%v", k, v)
			continue
		}
		if s, _ := v.(string); s == "" || (w != "*" && s != w) {
			t.Errorf("audit %s=%v, want %s", k, v, w)
		}
	}
	for k := range want {
		if _, ok := rec[k]; !ok {
			t.Errorf("audit record lacks %s: %v", k, rec)
		}
	}
}

// TestAuditEvents triggers each §279 event against a real daemon and checks
// its record: stable event name, typed attributes only.
func TestAuditEvents(t *testing.T) {
	b := enginetest.QuicBackend()

	t.Run("auth.failure", func(t *testing.T) {
		w := enginetest.NewWorld(t, b)
		id, other := w.NewIdentity(), w.NewIdentity()
		rc := w.DialRaw(id)
		rc.Hello(agentwire.RoleAgent)
		sess := wire.NewAgentSessionId()
		// Claims another runner than its certificate names.
		if got := rc.RegisterWith(sess, other.Runner, id.Cert.PrivateKey.(crypto.Signer), id.Cert.Certificate); isAccepted(got) {
			t.Fatal("forged registration accepted")
		}
		rec := awaitAudit(t, w, telemetry.EventAuthFailure)
		checkAudit(t, rec, map[string]string{"runner": other.Runner.String(), "session": sess.String(),
			"transport": rc.Ack.TransportSession.String(), "remote": "*", "code": wire.ErrCodeForbidden.String(),
			"reason": telemetry.ReasonRunnerMismatch.String()})
	})

	t.Run("session.fenced", func(t *testing.T) {
		w := enginetest.NewWorld(t, b, slowHeartbeat)
		id := w.NewIdentity()
		sess := wire.NewAgentSessionId()
		t1 := w.DialRaw(id)
		t1.Join(sess)
		t2 := w.DialRaw(id)
		t2.Join(sess)
		enginetest.Next[*agentwire.SessionFencedV1](t, t1)
		rec := awaitAudit(t, w, telemetry.EventSessionFenced)
		checkAudit(t, rec, map[string]string{"runner": id.Runner.String(), "session": sess.String(),
			"transport": t1.Ack.TransportSession.String(), "remote": "*", "reason": telemetry.ReasonNewerRegistration.String()})
	})

	t.Run("protocol.downgrade_rejected", func(t *testing.T) {
		v11 := wire.ProtocolVersion{Major: 1, Minor: 1}
		w := enginetest.NewWorld(t, b, func(c *daemon.Config) {
			c.Protocol = wire.ProtocolRange{Min: wire.ProtocolVersion{Major: 1}, Max: wire.ProtocolVersion{Major: 1, Minor: 3}}
			c.MinProtocol = v11
		})
		rc := w.DialRaw(w.NewIdentity())
		env, err := rc.Call(&agentwire.TransportHelloV1{Role: agentwire.RoleAgent, AgentVersion: "old",
			Versions: wire.ProtocolRange{Min: wire.ProtocolVersion{Major: 1}, Max: wire.ProtocolVersion{Major: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		if rj, ok := env.Payload.(*agentwire.RegistrationRejectedV1); !ok || rj.Code != wire.ErrCodeUnsupportedVersion {
			t.Fatalf("downgraded hello answered with %#v", env.Payload)
		}
		rec := awaitAudit(t, w, telemetry.EventDowngradeRejected)
		checkAudit(t, rec, map[string]string{"transport": "*", "remote": "*", "code": wire.ErrCodeUnsupportedVersion.String(),
			"reason": telemetry.ReasonVersionBelowMinimum.String()})
	})

	t.Run("lease.stale_replay", func(t *testing.T) {
		w := enginetest.NewWorld(t, b, slowHeartbeat)
		id := w.NewIdentity()
		sess := wire.NewAgentSessionId()
		rc := w.DialRaw(id)
		rc.Join(sess)
		_, err := rc.Call(&agentwire.LeaseAcceptedV1{Lease: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId(), Session: sess})
		wantWireErr(t, err, wire.ErrCodeStaleLease)
		rec := awaitAudit(t, w, telemetry.EventStaleLeaseReplay)
		checkAudit(t, rec, map[string]string{"runner": id.Runner.String(), "session": sess.String(),
			"transport": rc.Ack.TransportSession.String(), "remote": "*", "code": wire.ErrCodeStaleLease.String(),
			"reason": telemetry.ReasonLeaseSuperseded.String()})
	})

	t.Run("message.malformed_security", func(t *testing.T) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		bc, err := w.B.Dialer(t, w.ClientTLS(id)).Dial(ctx, w.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = bc.CloseWithCode(wire.CloseNormal, "") })
		sc, err := semantics.NewConn(bc, semantics.Config{})
		if err != nil {
			t.Fatal(err)
		}
		st, err := sc.OpenStream(ctx, wire.StreamControl)
		if err != nil {
			t.Fatal(err)
		}
		// A frame whose envelope header does not decode, before any hello:
		// part of the authentication handshake.
		secretish := []byte("not-an-envelope: key=hunter2")
		if err := st.WriteFrame(func(b []byte) []byte { return append(b, secretish...) }); err != nil {
			t.Fatal(err)
		}
		rec := awaitAudit(t, w, telemetry.EventMalformedSecurity)
		checkAudit(t, rec, map[string]string{"transport": "*", "remote": "*", "code": wire.ErrCodeMalformed.String(),
			"reason": telemetry.ReasonDecodeFailed.String()})
		if strings.Contains(w.LogBuf.String(), "hunter2") {
			t.Fatal("the malformed frame's bytes reached the log")
		}
	})

	t.Run("runner.revoked", func(t *testing.T) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		if err := w.Auth.SetRunnerEnabled(context.Background(), id.Runner, false, "stolen laptop", time.Now()); err != nil {
			t.Fatal(err)
		}
		rc := w.DialRaw(id)
		rc.Hello(agentwire.RoleAgent)
		sess := wire.NewAgentSessionId()
		got := rc.Register(sess)
		if rj, ok := got.(*agentwire.RegistrationRejectedV1); !ok || rj.Code != wire.ErrCodeRunnerDisabled {
			t.Fatalf("revoked runner's registration answered with %#v", got)
		}
		rec := awaitAudit(t, w, telemetry.EventRunnerRevoked)
		checkAudit(t, rec, map[string]string{"runner": id.Runner.String(), "session": sess.String(),
			"transport": rc.Ack.TransportSession.String(), "remote": "*", "code": wire.ErrCodeRunnerDisabled.String(),
			"reason": telemetry.ReasonRevoked.String()})
		if strings.Contains(w.LogBuf.String(), "stolen laptop") {
			t.Fatal("the operator's revoke reason reached the audit log") // free text never does
		}
	})

	t.Run("runner.revoked by the operator", func(t *testing.T) {
		w := enginetest.NewWorld(t, b, slowHeartbeat)
		id := w.NewIdentity()
		rc := w.DialRaw(id)
		rc.Join(wire.NewAgentSessionId())
		if err := w.D.DisableRunner(context.Background(), id.Runner, "key leaked on a pastebin"); err != nil {
			t.Fatal(err)
		}
		rec := awaitAudit(t, w, telemetry.EventRunnerRevoked)
		checkAudit(t, rec, map[string]string{"runner": id.Runner.String(), "code": wire.ErrCodeRunnerDisabled.String(),
			"reason": telemetry.ReasonRevoked.String()})
		if code := rc.CloseCode(); code != wire.CloseRunnerDisabled {
			t.Fatalf("revoked runner's transport closed with %s", code)
		}
		if strings.Contains(w.LogBuf.String(), "pastebin") {
			t.Fatal("the operator's revoke reason reached the log")
		}
	})
}
