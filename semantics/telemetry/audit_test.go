package telemetry_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"

	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

func TestAuditEventNames(t *testing.T) {
	want := []string{"auth.failure", "session.fenced", "transport.cloned_identity", "protocol.downgrade_rejected",
		"lease.stale_replay", "message.malformed_security", "runner.revoked", "runner.admin_command", "data.store_failed"}
	evs := telemetry.AuditEvents()
	if len(evs) != len(want) {
		t.Fatalf("%d events, want %d", len(evs), len(want))
	}
	var buf bytes.Buffer
	a := telemetry.NewAudit(slog.New(slog.NewJSONHandler(&buf, nil)))
	for i, e := range evs {
		if e.String() != want[i] {
			t.Errorf("event %d is %q, want %q", i, e, want[i])
		}
		a.Emit(context.Background(), e)
	}
	recs := records(t, &buf)
	if len(recs) != len(want) {
		t.Fatalf("%d records, want %d", len(recs), len(want))
	}
	for i, r := range recs {
		if r["event"] != want[i] || r["msg"] != "audit" || r["level"] != "WARN" {
			t.Errorf("record %d: %v", i, r)
		}
	}
	if telemetry.AuditEvent(0).String() != "unknown" || telemetry.AuditEvent(200).String() != "unknown" {
		t.Error("undefined events must render as unknown")
	}
}

func records(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(buf.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("audit line is not JSON: %v: %s", err, sc.Bytes())
		}
		out = append(out, m)
	}
	return out
}

func TestAuditAttributes(t *testing.T) {
	var buf bytes.Buffer
	a := telemetry.NewAudit(slog.New(slog.NewJSONHandler(&buf, nil)))
	runner := wire.RunnerId{ULID: ulid.Make()}
	sess := wire.AgentSessionId{ULID: ulid.Make()}
	tr := wire.TransportSessionId{ULID: ulid.Make()}
	a.Emit(context.Background(), telemetry.EventClonedIdentity,
		telemetry.Runner(runner), telemetry.Session(sess), telemetry.Transport(tr),
		telemetry.Remote(&net.UDPAddr{IP: net.ParseIP("192.0.2.10"), Port: 50123}),
		telemetry.Code(wire.ErrCodeSessionFenced), telemetry.Reason(telemetry.ReasonFencedTraffic),
		telemetry.Reason(telemetry.ReasonNewerRegistration), // repeated key: last wins
		telemetry.AuditAttr{})
	a.Emit(context.Background(), telemetry.EventAuthFailure,
		telemetry.RemoteAddrPort(netip.MustParseAddrPort("[2001:db8::1]:7443")),
		telemetry.Code(wire.ProtocolErrorCode(999)), telemetry.Reason(telemetry.AuditReason(250)))
	recs := records(t, &buf)
	if len(recs) != 2 {
		t.Fatalf("%d records", len(recs))
	}
	want0 := map[string]any{"event": "transport.cloned_identity", "runner": runner.String(), "session": sess.String(),
		"transport": tr.String(), "remote": "192.0.2.10:50123", "code": "SessionFenced", "reason": "newer_registration"}
	for k, v := range want0 {
		if recs[0][k] != v {
			t.Errorf("record 0 %s = %v, want %v", k, recs[0][k], v)
		}
	}
	want1 := map[string]any{"event": "auth.failure", "remote": "[2001:db8::1]:7443", "code": "999", "reason": "unspecified"}
	for k, v := range want1 {
		if recs[1][k] != v {
			t.Errorf("record 1 %s = %v, want %v", k, recs[1][k], v)
		}
	}
	// Attributes appear in the documented order.
	line := strings.SplitN(buf.String(), "\n", 2)[0]
	last := -1
	for _, k := range []string{`"event"`, `"runner"`, `"session"`, `"transport"`, `"remote"`, `"code"`, `"reason"`} {
		i := strings.Index(line, k)
		if i < last {
			t.Errorf("key %s out of order in %s", k, line)
		}
		last = i
	}

	// A logger above Warn writes nothing; a nil Audit drops events.
	buf.Reset()
	telemetry.NewAudit(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError}))).
		Emit(context.Background(), telemetry.EventRunnerRevoked, telemetry.Runner(runner))
	var nilAudit *telemetry.Audit
	nilAudit.Emit(context.Background(), telemetry.EventRunnerRevoked)
	if buf.Len() != 0 {
		t.Errorf("disabled level still wrote %s", buf.String())
	}
}

// AuditAttr has no exported field: attributes exist only through the typed
// constructors, so no free-form payload can be attached.
func TestAuditAttrIsOpaque(t *testing.T) {
	typ := reflect.TypeOf(telemetry.AuditAttr{})
	for i := range typ.NumField() {
		if typ.Field(i).IsExported() {
			t.Errorf("AuditAttr exports field %s", typ.Field(i).Name)
		}
	}
}

// evilAddr is a net.Addr a careless caller built from the wrong value.
type evilAddr struct{ network, s string }

func (a evilAddr) Network() string { return a.network }
func (a evilAddr) String() string  { return a.s }

type ctxKey struct{}

// TestAuditRedactsByConstruction plants a bearer token, a private key PEM
// and a SecretMaterialV1 payload in every position of the Audit API a
// careless caller could reach and asserts none of it reaches the JSON or
// text log output (§212).
func TestAuditRedactsByConstruction(t *testing.T) {
	token := "fyt_live_" + strings.Repeat("Zq9", 10) + "Bearer-PLANTED"

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))

	secret := sample[*agentwire.SecretMaterialV1](t)
	secret.Bytes = agentwire.SecretBytes("PLANTED-SECRET-MATERIAL-4c1e")
	payload := string(secret.AppendPostcard(nil))

	secrets := map[string]string{"token": token, "pem": keyPEM, "secret-bytes": string(secret.Bytes), "secret-payload": payload}

	// The forms in which a leak would show up.
	forms := func(s string) []string {
		out := []string{s, hex.EncodeToString([]byte(s)), base64.StdEncoding.EncodeToString([]byte(s))}
		if len(s) > 24 {
			out = append(out, s[4:24]) // a slice of it (escaping may change the ends)
		}
		return out
	}
	pemBody := base64.StdEncoding.EncodeToString(der)

	for _, h := range []struct {
		name string
		new  func(*bytes.Buffer) slog.Handler
	}{
		{"json", func(b *bytes.Buffer) slog.Handler {
			return slog.NewJSONHandler(b, &slog.HandlerOptions{AddSource: true})
		}},
		{"text", func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) }},
	} {
		var buf bytes.Buffer
		a := telemetry.NewAudit(slog.New(h.new(&buf)))
		emitted := 0
		for name, s := range secrets {
			ctx := context.WithValue(context.Background(), ctxKey{}, s)
			var idBytes ulid.ULID
			copy(idBytes[:], s) // an id made from secret bytes still renders only as an id
			for _, ev := range append(telemetry.AuditEvents(), telemetry.AuditEvent(0), telemetry.AuditEvent(255)) {
				// One record per remote variant (a repeated key keeps its
				// last value, so each goes in its own record).
				for _, remote := range []net.Addr{evilAddr{network: s, s: s}, evilAddr{network: "udp", s: s}} {
					a.Emit(ctx, ev,
						telemetry.Runner(wire.RunnerId{ULID: idBytes}),
						telemetry.Session(wire.AgentSessionId{ULID: idBytes}),
						telemetry.Transport(wire.TransportSessionId{ULID: idBytes}),
						telemetry.Remote(remote),
						telemetry.Code(wire.ProtocolErrorCode(len(s))),
						telemetry.Reason(telemetry.AuditReason(len(s))),
					)
					emitted++
				}
			}
			_ = name
		}
		out := buf.String()
		if n := strings.Count(out, "\n"); n != emitted || !strings.Contains(out, "transport.cloned_identity") {
			t.Fatalf("%s: %d records for %d emits (test would pass vacuously):\n%s", h.name, n, emitted, out)
		}
		for name, s := range secrets {
			for _, f := range forms(s) {
				if strings.Contains(out, f) {
					t.Errorf("%s: %s leaks into the audit log (form %q)", h.name, name, f)
				}
			}
		}
		for _, frag := range []string{"PRIVATE KEY", pemBody[10:40], "PLANTED", "Bearer"} {
			if strings.Contains(out, frag) {
				t.Errorf("%s: audit log contains %q", h.name, frag)
			}
		}
		if h.name == "json" {
			allowed := map[string]bool{"time": true, "level": true, "msg": true, "source": true,
				"event": true, "runner": true, "session": true, "transport": true, "remote": true, "code": true, "reason": true}
			for _, r := range records(t, &buf) {
				for k := range r {
					if !allowed[k] {
						t.Errorf("audit record has attribute %q", k)
					}
				}
			}
		}
	}
}
