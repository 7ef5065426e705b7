package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/trust"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// TestDemoSmall runs the demo's whole scenario with 2 agents (one QUIC
// through a UDP proxy that gets cut, one TLS+yamux through a TCP proxy to
// the in-process relay, which reaches the daemon over QUIC) and 8 leases,
// through the command's entry point.
func TestDemoSmall(t *testing.T) {
	dir := filepath.Join(t.TempDir(), ".demo")
	var out, errOut bytes.Buffer
	start := time.Now()
	code := run(context.Background(), []string{"-dir", dir, "-agents", "2", "-leases", "8"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	if el := time.Since(start); el > 20*time.Second {
		t.Errorf("demo took %v", el)
	}
	s := out.String()
	for _, want := range []string{"Authority check: 8/8 accepted attempts completed exactly once — PASS", "DuplicateAccepted 1", "(cut)", "quic", "relay+yamux", "→ relay 127.0.0.1:", "(the relay)", "Relay yamux://",
		"offer → accept", "completion → ack", "cancel delivery", "ended Cancelled",
		"live log of attempt", "[step 3]", "received cancellation", "Payload (CAS download)", "Cut upload", "stored and verified: true",
		"device log | PASS checkout", "signature verified: true; unattested request refused: bad-attestation",
		"suite smoke 3 passed, 0 failed, 5 log lines streamed; stale reservation refused: true"} {
		if !strings.Contains(s, want) && !(want == "DuplicateAccepted 1" && strings.Contains(s, "DuplicateAccepted ")) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
	// The dev PKI persists and is reused by the next run.
	pki, err := trust.LoadDevPKI(filepath.Join(dir, "pki"))
	if err != nil || len(pki.Agents) != 2 {
		t.Fatalf("dev PKI: %v %+v", err, pki)
	}
	if _, err := os.Stat(filepath.Join(dir, "authority.db")); err != nil {
		t.Errorf("authority database: %v", err)
	}
}

// TestDemoReport checks the report's invariants on a direct run with 4
// agents: QUIC (cut), relay over TLS+yamux, WebTransport, TLS+yamux.
func TestDemoReport(t *testing.T) {
	p := defaultParams()
	p.Dir, p.Agents, p.Leases, p.MaxParallel = filepath.Join(t.TempDir(), "d"), 4, 9, 2
	rep, err := runDemo(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Pass || rep.Attempts != 9 || rep.ExactlyOnce != 9 {
		t.Fatalf("report: pass=%v attempts=%d exactly-once=%d failure=%q", rep.Pass, rep.Attempts, rep.ExactlyOnce, rep.Failure)
	}
	if !rep.CutDuplicate || rep.Stats.Completions[agentwire.AckDuplicateAccepted] < 1 {
		t.Errorf("no DuplicateAccepted after the cut: %+v", rep.Stats.Completions)
	}
	if rep.Agents[0].Reconnects < 1 || !rep.Agents[0].Cut || rep.Stats.Reconnects < 1 {
		t.Errorf("cut agent did not reconnect: %+v", rep.Agents[0])
	}
	// Each agent's backend as the agent sees it, its fallback class, and
	// the transport the daemon registered it on (the relayed agent: the
	// relay's QUIC connection).
	for i, want := range []struct{ backend, class, daemon string }{
		{"quic", "quic", "quic from "}, {"relay+yamux", "relay", "quic from "},
		{"webtransport", "webtransport", "webtransport from "}, {"yamux", "tcp", "yamux from "},
	} {
		a := rep.Agents[i]
		if a.Backend != want.backend || a.Class != want.class || !strings.HasPrefix(a.DaemonSide, want.daemon) || a.Attempts == 0 {
			t.Errorf("agent %s: backend %q class %q daemon side %q attempts %d, want %+v", a.Name, a.Backend, a.Class, a.DaemonSide, a.Attempts, want)
		}
	}
	if !strings.Contains(rep.Agents[1].Path, "→ relay "+rep.Relay+" → quic "+rep.DaemonQUIC) || !strings.HasSuffix(rep.Agents[1].DaemonSide, "(the relay)") {
		t.Errorf("relayed agent: path %q, daemon side %q", rep.Agents[1].Path, rep.Agents[1].DaemonSide)
	}
	if rs := rep.RelayStats; rs.Accepted < 1 || rs.Streams < 3 || rs.BytesToDaemon == 0 || rs.BytesToAgent < payloadSize {
		t.Errorf("relay stats %+v", rs)
	}
	if rep.CD.N != 1 || rep.CancelResult != agentwire.ResultCancelled {
		t.Errorf("cancel: %+v %v", rep.CD, rep.CancelResult)
	}
	if rep.OfferAccept.N != 9 || rep.OfferAccept.P50 <= 0 || rep.OfferAccept.P99 < rep.OfferAccept.P50 {
		t.Errorf("offer latency %+v", rep.OfferAccept)
	}
	if rep.Stats.LeasesAccepted != 9 || rep.Stats.Completions[agentwire.AckAccepted] != 9 {
		t.Errorf("stats %+v", rep.Stats)
	}
	// Data plane: the tailed log, the payload downloads, every claimed
	// output stored, and the cut upload resumed from its kept prefix.
	dr := rep.Data
	if dr.TailLines < 8 || dr.LogFrames == 0 || dr.Downloads < 1 || dr.PayloadsVerified != 9 || dr.PayloadsFailed != 0 {
		t.Errorf("logs/payload: %+v", dr)
	}
	if dr.Claimed < 8 || dr.Stored != dr.Claimed {
		t.Errorf("outputs: %d of %d claimed outputs stored", dr.Stored, dr.Claimed)
	}
	if dr.CutAt < bigOutputSize/2 || dr.Resumed < 1 || dr.ResumedPrefix < bigOutputSize/2 || !dr.BigStored {
		t.Errorf("cut upload: %+v", dr)
	}
}

func TestUsage(t *testing.T) {
	var o, e bytes.Buffer
	if code := run(context.Background(), []string{"-agents", "1"}, &o, &e); code != 2 {
		t.Errorf("exit %d for -agents 1", code)
	}
	if code := run(context.Background(), []string{"-leases", "3"}, &o, &e); code != 2 {
		t.Errorf("exit %d for -leases 3", code)
	}
}
