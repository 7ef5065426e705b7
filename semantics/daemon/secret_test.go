package daemon_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// plantedValue returns a distinctive random secret value.
func plantedValue(name string) []byte {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return []byte("PLANTED-" + name + "-" + hex.EncodeToString(b[:]))
}

// secretExec uses two secrets and reports what it saw.
type secretExec struct {
	want    map[string][]byte
	matched chan map[string]bool
	peek    chan []agentwire.SecretBytes // the slices fn saw, to check zeroing
}

func (e *secretExec) Execute(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
	ok := map[string]bool{}
	var seen []agentwire.SecretBytes
	for _, id := range []string{"ci/deploy-key", "ci/api-token"} {
		err := agent.UseSecret(ctx, id, func(b agentwire.SecretBytes) error {
			ok[id] = bytes.Equal(b, e.want[id])
			seen = append(seen, b)
			// What a careless executor might do: log the value through
			// the redacting type, and write about it to the job log.
			slog.Default().Info("secret", "value", b)
			_ = out.Log(wlogs.LogStdout, []byte("using "+id+" ("+b.String()+")\n"))
			return nil
		})
		if err != nil {
			return agent.Result{Kind: agentwire.ResultFailed, ExitCode: 2, Message: err.Error()}
		}
	}
	if err := agent.UseSecret(ctx, "ci/deploy-key", func(agentwire.SecretBytes) error { return nil }); !errors.Is(err, agent.ErrSecretGone) {
		return agent.Result{Kind: agentwire.ResultFailed, ExitCode: 3, Message: "second use: " + errString(err)}
	}
	if _, err := out.PutOutput([]byte("build output, no secret here")); err != nil {
		return agent.Result{Kind: agentwire.ResultFailed, ExitCode: 4, Message: err.Error()}
	}
	e.matched <- ok
	e.peek <- seen
	return agent.Result{Kind: agentwire.ResultSucceeded}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// TestSecretNeverLeaks (real loopback QUIC): secrets delivered on a
// dedicated secret stream reach the executor of the leased attempt intact,
// are zeroed after use, cannot be used twice, and after a full attempt
// (log stream, CAS output, completion) with every log at debug level and
// every file in temp dirs (authority database, daemon log dir, CAS store,
// agent spool), no planted value — raw, hex or base64 — appears anywhere.
func TestSecretNeverLeaks(t *testing.T) {
	dir := t.TempDir()
	auth, err := authority.OpenSQLite(context.Background(), filepath.Join(dir, "authority.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = auth.Close() })
	store, err := cas.NewFSStore(cas.FSStoreConfig{Dir: filepath.Join(dir, "cas")})
	if err != nil {
		t.Fatal(err)
	}
	logs := &enginetest.SyncBuffer{}
	debug := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	prev := slog.Default()
	slog.SetDefault(debug)
	t.Cleanup(func() { slog.SetDefault(prev) })
	w := enginetest.NewWorldWith(t, enginetest.QuicBackend(), trusttest.NewPKI(t), auth, func(c *daemon.Config) {
		c.Logger, c.LogDir, c.ContentStore = debug, filepath.Join(dir, "daemon-logs"), store
	})
	secrets := map[string][]byte{"ci/deploy-key": plantedValue("deploy"), "ci/api-token": plantedValue("token")}
	exec := &secretExec{want: map[string][]byte{}, matched: make(chan map[string]bool, 1), peek: make(chan []agentwire.SecretBytes, 1)}
	for k, v := range secrets {
		exec.want[k] = bytes.Clone(v)
	}
	id := w.NewIdentity()
	a, _, _ := w.StartAgent(id, exec, enginetest.SpoolIn(filepath.Join(dir, "spool")), func(c *agent.Config) { c.Logger = debug })
	enginetest.AwaitConnected(t, a)
	w.AwaitActive(id.Runner)
	l, err := w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(1))
	if err != nil {
		t.Fatal(err)
	}
	var send []daemon.Secret
	for _, k := range []string{"ci/deploy-key", "ci/api-token"} {
		send = append(send, daemon.Secret{ID: k, Bytes: bytes.Clone(secrets[k]), ExpiresAt: time.Now().Add(time.Minute)})
	}
	if err := w.D.SendSecrets(context.Background(), l.ID, send...); err != nil {
		t.Fatalf("SendSecrets: %v", err)
	}
	for _, s := range send {
		clear(s.Bytes)
	}
	select {
	case m := <-exec.matched:
		if !m["ci/deploy-key"] || !m["ci/api-token"] {
			t.Fatalf("executor saw wrong secret bytes: %v", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("executor never got its secrets")
	}
	for i, b := range <-exec.peek {
		if len(b) == 0 || !bytes.Equal(b, make([]byte, len(b))) {
			t.Fatalf("secret %d not zeroed after use", i)
		}
	}
	w.AwaitCompletion(l.Attempt, agentwire.AckAccepted)
	// The lease is completed: no agent holds it any more.
	if err := w.D.SendSecrets(context.Background(), l.ID, daemon.Secret{ID: "late", Bytes: []byte("late")}); !errors.Is(err, daemon.ErrSecretLease) {
		t.Fatalf("secret for a completed lease: %v", err)
	}
	if st := w.D.HardeningStats(); st.SecretsSent != 1 {
		t.Fatalf("secrets sent %d", st.SecretsSent)
	}

	grep := func(where string, data []byte) {
		for k, v := range secrets {
			for _, form := range [][]byte{v, []byte(hex.EncodeToString(v)), []byte(base64.StdEncoding.EncodeToString(v))} {
				if bytes.Contains(data, form) {
					t.Errorf("secret %s found in %s", k, where)
				}
			}
		}
	}
	files, jobLog := 0, false
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("read %s: %v", p, err)
			return nil
		}
		files++
		jobLog = jobLog || bytes.Contains(data, []byte("using ci/api-token (<redacted"))
		grep(p, data)
		return nil
	})
	out := logs.String()
	grep("debug logs", []byte(out))
	if files < 3 || !jobLog || !strings.Contains(out, `"level":"DEBUG"`) || !strings.Contains(out, "<redacted") || !strings.Contains(out, "secrets delivered") {
		t.Fatalf("the grep saw %d files and %d bytes of logs without debug records, the redacted value or the delivery record: the check proves nothing", files, len(out))
	}
	t.Logf("grepped %d files and %d bytes of debug logs: no planted value", files, len(out))
}

// TestSecretDeliveryRules (memory): secrets only for an accepted lease of
// a connected session, with a future expiry; a raw peer that does not
// hold the attempt cannot acknowledge them; UseSecret outside an attempt
// fails.
func TestSecretDeliveryRules(t *testing.T) {
	w := enginetest.NewWorld(t, enginetest.MemoryBackend(), slowHeartbeat)
	if err := w.D.SendSecrets(context.Background(), wire.NewLeaseId(), daemon.Secret{ID: "x", Bytes: []byte("x")}); !errors.Is(err, daemon.ErrSecretLease) {
		t.Fatalf("unknown lease: %v", err)
	}
	id := w.NewIdentity()
	exec := enginetest.NewCountingExec(true)
	a, _, _ := w.StartAgent(id, exec)
	enginetest.AwaitConnected(t, a)
	w.AwaitActive(id.Runner)
	l, err := w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(2))
	if err != nil {
		t.Fatal(err)
	}
	enginetest.AwaitStart(t, exec)
	if err := w.D.SendSecrets(context.Background(), l.ID, daemon.Secret{ID: "x", Bytes: []byte("x"), ExpiresAt: time.Now().Add(-time.Second)}); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired secret: %v", err)
	}
	if err := w.D.SendSecrets(context.Background(), l.ID); err == nil {
		t.Fatal("no secrets accepted")
	}
	if err := w.D.SendSecrets(context.Background(), l.ID, daemon.Secret{ID: "", Bytes: []byte("x")}); err == nil {
		t.Fatal("empty secret id accepted")
	}
	// Held by the agent: delivered (the executor never uses it; it is
	// zeroed when Execute returns).
	if err := w.D.SendSecrets(context.Background(), l.ID, daemon.Secret{ID: "unused", Bytes: []byte("unused-secret")}); err != nil {
		t.Fatalf("secret for a held lease: %v", err)
	}
	// The same id again is refused by the agent only once used; a repeat
	// before use replaces it.
	if err := w.D.SendSecrets(context.Background(), l.ID, daemon.Secret{ID: "unused", Bytes: []byte("unused-secret-2")}); err != nil {
		t.Fatalf("repeat before use: %v", err)
	}
	close(exec.Release)
	w.AwaitCompletion(l.Attempt, agentwire.AckAccepted)
	if err := agent.UseSecret(context.Background(), "x", func(agentwire.SecretBytes) error { return nil }); !errors.Is(err, agent.ErrNoSecrets) {
		t.Fatalf("UseSecret outside an attempt: %v", err)
	}

	// A raw peer that took a lease but serves no secret stream: the
	// delivery fails (refused or timed out), never reports success.
	rid := w.NewIdentity()
	rc := w.DialRaw(rid)
	rc.Join(wire.NewAgentSessionId())
	done := make(chan authority.Lease, 1)
	go func() {
		l, _ := w.D.OfferLease(context.Background(), rid.Runner, enginetest.Offer(3))
		done <- l
	}()
	o, env := enginetest.Next[*agentwire.LeaseOfferV1](t, rc)
	if err := rc.Ch.Reply(env, &agentwire.LeaseAcceptedV1{Lease: o.Lease, Attempt: o.Attempt, Session: rc.Sess}); err != nil {
		t.Fatal(err)
	}
	<-done
	if err := w.D.SendSecrets(context.Background(), o.Lease, daemon.Secret{ID: "x", Bytes: []byte("x")}); err == nil {
		t.Fatal("a peer that never read the secret stream acknowledged it")
	}
}
