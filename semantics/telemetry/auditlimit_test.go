package telemetry

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func jsonRecords(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(buf.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not JSON: %v: %s", err, sc.Bytes())
		}
		out = append(out, m)
	}
	return out
}

// TestAuditLimiterBounds: a burst of 200 records writes exactly the burst,
// the next record after a refill carries the suppressed count, a pending
// count is written by the summary timer and by Close, and the counts add
// up to every record offered.
func TestAuditLimiterBounds(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	l := NewAuditLimiter(NewAudit(log), log, 10, 20)
	now := time.Unix(1_000_000, 0)
	l.now = func() time.Time { return now }
	var pending []func()
	l.after = func(d time.Duration, f func()) *time.Timer {
		pending = append(pending, f)
		return time.NewTimer(time.Hour) // stopped by the limiter, never fires
	}
	ctx := context.Background()
	written := 0
	for range 200 {
		if l.Emit(ctx, EventAuthFailure, Reason(ReasonUnknownAuthority)) {
			written++
		}
	}
	if written != 20 || l.Suppressed() != 180 {
		t.Fatalf("burst of 200: %d written, %d suppressed; want 20, 180", written, l.Suppressed())
	}
	if len(pending) != 1 {
		t.Fatalf("%d summary timers armed, want 1", len(pending))
	}
	now = now.Add(time.Second) // 10 tokens
	if !l.Emit(ctx, EventAuthFailure, Reason(ReasonUnknownAuthority)) {
		t.Fatal("no record after a refill")
	}
	for range 20 {
		l.Emit(ctx, EventAuthFailure)
	}
	if len(pending) != 2 { // the first was stopped by the record after the refill
		t.Fatalf("%d summary timers armed, want 2", len(pending))
	}
	pending[1]() // summary of the 11 suppressed after the refill
	pending[0]() // a stale timer firing late finds nothing pending
	for range 3 {
		l.Emit(ctx, EventAuthFailure)
	}
	l.Close() // summary of the last 3
	l.Close()
	recs := jsonRecords(t, &buf)
	var audits, suppressed int
	var summaries []float64
	for _, r := range recs {
		switch r["msg"] {
		case "audit":
			audits++
			if s, ok := r["suppressed"].(string); ok {
				if s != "180" {
					t.Errorf("suppressed=%s on the first record after the burst, want 180", s)
				}
				suppressed += 180
			}
		case "audit suppressed":
			if r["event"] != "auth.failure" {
				t.Errorf("summary record %v", r)
			}
			n, _ := r["suppressed"].(float64)
			summaries = append(summaries, n)
			suppressed += int(n)
		default:
			t.Errorf("unexpected record %v", r)
		}
	}
	if audits != 20+1+9 || len(summaries) != 2 || summaries[0] != 11 || summaries[1] != 3 {
		t.Errorf("%d audit records, summaries %v; want 30, [11 3]", audits, summaries)
	}
	if audits+suppressed != 200+1+20+3 {
		t.Errorf("%d written + %d suppressed != %d offered", audits, suppressed, 224)
	}
}

// TestAuditLimiterTimer: the real timer writes the summary.
func TestAuditLimiterTimer(t *testing.T) {
	var buf syncBuffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	l := NewAuditLimiter(NewAudit(log), log, 1, 1)
	l.summaryLag = time.Millisecond
	done := make(chan struct{})
	l.after = func(d time.Duration, f func()) *time.Timer {
		return time.AfterFunc(d, func() { f(); close(done) })
	}
	l.Emit(context.Background(), EventAuthFailure)
	l.Emit(context.Background(), EventAuthFailure)
	<-done
	if s := buf.String(); !strings.Contains(s, `"msg":"audit suppressed"`) || !strings.Contains(s, `"suppressed":1`) {
		t.Fatalf("no summary record: %s", s)
	}
	var nilL *AuditLimiter
	if nilL.Emit(context.Background(), EventAuthFailure) || nilL.Suppressed() != 0 {
		t.Fatal("nil limiter")
	}
	nilL.Close()
}

func TestHandshakeAuditAttrs(t *testing.T) {
	var buf bytes.Buffer
	a := NewAudit(slog.New(slog.NewJSONHandler(&buf, nil)))
	cert := &x509.Certificate{
		Subject:      pkix.Name{CommonName: "evil\n\x00name é" + strings.Repeat("x", 300)},
		Issuer:       pkix.Name{CommonName: "Other CA"},
		SerialNumber: big.NewInt(0xabc),
	}
	a.Emit(context.Background(), EventAuthFailure, Backend("yamux"), RemoteIP(&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.1"), Port: 4444}),
		Reason(AuditReasonOfHandshake("unknown_authority")), ByPeer(false), CertSubject(cert), CertIssuer(cert), CertSerial(cert),
		ErrorText(errors.New("tls: bad\tthing")), CertSubject(nil), Backend("10.0.0.1:5"))
	r := jsonRecords(t, &buf)[0]
	want := map[string]string{"event": "auth.failure", "backend": "other", "remote": "192.0.2.1", "reason": "unknown_authority",
		"by_peer": "false", "cert_issuer": "CN=Other CA", "cert_serial": "abc", "error": "tls: bad?thing"}
	for k, v := range want {
		if r[k] != v {
			t.Errorf("%s = %v, want %q", k, r[k], v)
		}
	}
	subj, _ := r["cert_subject"].(string)
	if len(subj) != maxAuditText || !strings.HasPrefix(subj, `CN=evil`) || strings.ContainsAny(subj, "\n\x00é") {
		t.Errorf("cert_subject not sanitized: %q", subj)
	}
	for _, reason := range HandshakeFailureReasons {
		if reason != "other" && AuditReasonOfHandshake(reason).String() != reason {
			t.Errorf("AuditReasonOfHandshake(%q) = %q", reason, AuditReasonOfHandshake(reason))
		}
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
