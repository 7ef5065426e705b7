package daemon_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// planted is a secret value and the encodings it could leak in.
type planted struct {
	what  string
	forms [][]byte
}

func plant(what string, raw []byte) planted {
	p := planted{what: what, forms: [][]byte{raw, []byte(hex.EncodeToString(raw)), []byte(strings.ToUpper(hex.EncodeToString(raw))),
		[]byte(base64.StdEncoding.EncodeToString(raw)), []byte(base64.RawURLEncoding.EncodeToString(raw))}}
	if len(raw) > 48 { // a leak of part of a long value (a key's PEM line) counts too
		p.forms = append(p.forms, []byte(base64.StdEncoding.EncodeToString(raw)[16:64]))
	}
	return p
}

func randomToken(t *testing.T, prefix string) []byte {
	t.Helper()
	var b [18]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return []byte(prefix + base64.RawURLEncoding.EncodeToString(b[:]))
}

// TestPlantedSecretsNeverLogged (§212, §289) runs a full daemon + agent over
// loopback QUIC with every log at debug level written to files, a file
// SQLite authority, a file log sink and the agent's spool all under one run
// directory, and plants secret values where a careless implementation
// would log or persist them: the agent's private key (which signs the key
// proof), a bearer-token-like value inside an output object (a payload:
// it must reach the CAS store and nowhere else), inside a malformed
// pre-registration frame, inside an agent-reported WireErrorV1 text, and
// inside a forged certificate chain. Afterwards every file of the run
// directory except the CAS store (where the output belongs) is searched for
// each value in raw, hex and base64 form: none may appear.
func TestPlantedSecretsNeverLogged(t *testing.T) {
	b := enginetest.QuicBackend()
	run := t.TempDir()
	logDir, spool, casDir := filepath.Join(run, "logs"), filepath.Join(run, "spool"), filepath.Join(run, "cas")
	openLog := func(name string) *slog.Logger {
		f, err := os.Create(filepath.Join(run, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.Close() })
		return slog.New(slog.NewJSONHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	auth, err := authority.OpenSQLite(context.Background(), filepath.Join(run, "authority.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = auth.Close() })
	store, err := cas.NewFSStore(cas.FSStoreConfig{Dir: casDir})
	if err != nil {
		t.Fatal(err)
	}
	w := enginetest.NewWorldWith(t, b, trusttest.NewPKI(t), auth, func(c *daemon.Config) {
		c.Logger, c.LogDir, c.ContentStore = openLog("daemon.log"), logDir, store
	})
	id := w.NewIdentity()

	keyDER, err := x509.MarshalPKCS8PrivateKey(id.Cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	outputToken := randomToken(t, "fyt_output_")
	frameToken := randomToken(t, "fyt_frame_")
	errorToken := randomToken(t, "fyt_error_")
	chainToken := randomToken(t, "fyt_chain_")
	secrets := []planted{plant("agent private key", keyDER), plant("output token", outputToken),
		plant("malformed-frame token", frameToken), plant("wire-error token", errorToken), plant("forged-chain token", chainToken)}

	// 1. A real agent runs a job whose output carries a token, and logs
	// ordinary lines.
	var outRef wire.CasObjectRef
	exec := agent.ExecutorFunc(func(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
		_ = out.Log(wlogs.LogStdout, []byte("compiling\nlinking\n"))
		ref, err := out.PutOutput(append([]byte("credentials: Authorization: Bearer "), outputToken...))
		if err != nil {
			return agent.Result{Kind: agentwire.ResultInfraError, Message: "output not stored"}
		}
		outRef = ref
		return agent.Result{Kind: agentwire.ResultSucceeded}
	})
	a, _, _ := w.StartAgent(id, exec, func(c *agent.Config) { c.Logger, c.SpoolDir = openLog("agent.log"), spool })
	w.AwaitActive(id.Runner)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := w.D.OfferLease(ctx, id.Runner, enginetest.Offer(1))
	if err != nil {
		t.Fatal(err)
	}
	done := w.AwaitCompletion(l.Attempt, agentwire.AckAccepted)
	if len(done.Result.Kind.String()) == 0 || outRef == (wire.CasObjectRef{}) {
		t.Fatal("the job did not store its output")
	}

	// 2. A malformed frame before registration, carrying a token.
	other := w.NewIdentity()
	bc, err := w.B.Dialer(t, w.ClientTLS(other)).Dial(ctx, w.Addr)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := semantics.NewConn(bc, semantics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := sc.OpenStream(ctx, wire.StreamControl)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.WriteFrame(func(b []byte) []byte { return append(append(b, 0xff, 0x01), frameToken...) }); err != nil {
		t.Fatal(err)
	}
	_ = st.Close()

	// 3. An agent-reported error whose text carries a token, and a
	// registration whose certificate chain is a token.
	rc := w.DialRaw(other)
	rc.Join(wire.NewAgentSessionId())
	if _, err := rc.Ch.SendMsg(&wire.WireErrorV1{Code: wire.ErrCodeInternal, Retry: wire.RetryNever,
		Message: "executor env: API_TOKEN=" + string(errorToken)}); err != nil {
		t.Fatal(err)
	}
	forger := w.DialRaw(other)
	forger.Hello(agentwire.RoleAgent)
	if got := forger.RegisterWith(wire.NewAgentSessionId(), other.Runner, other.Cert.PrivateKey.(crypto.Signer), [][]byte{chainToken}); isAccepted(got) {
		t.Fatal("a registration with a garbage certificate chain was accepted")
	}
	awaitAuditIn(t, filepath.Join(run, "daemon.log"), `"event":"auth.failure"`)

	// The agent leaves (its spool is removed); the daemon shuts down (its
	// log sink is closed).
	_ = a.Close()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	_ = w.D.Shutdown(sctx)

	// The planted output reached its one legitimate place.
	if !bytes.Contains(readObject(t, store, outRef), outputToken) {
		t.Fatal("the output did not reach the CAS store: the search below would prove nothing")
	}
	// The daemon's log is real: debug records of the run are there (the
	// agent logs little on a clean run; its file is searched all the same).
	if b, _ := os.ReadFile(filepath.Join(run, "daemon.log")); bytes.Count(b, []byte("\n")) < 3 {
		t.Fatalf("daemon.log has %d lines; the run logged nothing to search", bytes.Count(b, []byte("\n")))
	}

	searched := 0
	err = filepath.WalkDir(run, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == casDir {
				return filepath.SkipDir
			}
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		searched++
		for _, s := range secrets {
			for _, form := range s.forms {
				if bytes.Contains(b, form) {
					rel, _ := filepath.Rel(run, path)
					t.Errorf("%s leaked into %s (as %q…)", s.what, rel, form[:min(len(form), 24)])
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if searched < 3 {
		t.Fatalf("searched only %d files", searched)
	}
}

func awaitAuditIn(t *testing.T, file, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if b, _ := os.ReadFile(file); bytes.Contains(b, []byte(want)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared in %s", want, file)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
