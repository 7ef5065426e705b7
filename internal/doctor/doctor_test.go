package doctor

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestReport(t *testing.T) {
	var r Report
	r.Add(Finding{Check: "dns", Target: "quic://h:7443", Result: OK, Detail: "h resolves"})
	if r.Result != OK || r.Failed() {
		t.Fatalf("after OK: %v", r.Result)
	}
	r.Add(Finding{Check: "clock", Result: Warn, Detail: "skew", Fix: "run NTP"})
	r.Add(Finding{Check: "mtu", Result: Skip, Detail: "skipped"})
	if r.Result != Warn {
		t.Fatalf("after WARN+SKIP: %v", r.Result)
	}
	r.Add(Finding{Check: "udp", Result: Fail, Detail: "UDP blocked\nreally", Fix: "allow UDP 7443"})
	r.Add(Finding{Check: "tls", Result: Warn})
	if r.Result != Fail || !r.Failed() {
		t.Fatalf("after FAIL: %v", r.Result)
	}
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"RESULT  CHECK  TARGET         DETAIL", "OK      dns    quic://h:7443  h resolves", "FAIL    udp    -              UDP blocked really",
		"  fix: allow UDP 7443", "FAIL: 5 checks, 1 failed, 2 warnings"} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || back.Result != Fail || len(back.Findings) != 5 || back.Findings[3].Fix != "allow UDP 7443" {
		t.Errorf("json round trip: %v %+v", err, back)
	}
	var empty Report
	b.Reset()
	_ = empty.WriteText(&b)
	if !strings.Contains(b.String(), "OK: 0 checks") {
		t.Errorf("empty report: %s", b.String())
	}
}
