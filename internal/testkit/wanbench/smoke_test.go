package wanbench

import (
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/trust/trusttest"
)

// TestWANSmoke runs the benchmark's measurements once, briefly, on one
// emulated path (2 ms RTT, 0.5 % loss, 50 Mbit/s) for our quic backend
// through the relay over yamux and for raw quic-go, and checks that every
// measurement produced a result: the CAS object arrived verified, the log
// was finalized, the agent registered, and bulk moved while the pings ran.
// It asserts no speed (performance lives in BenchmarkWAN).
func TestWANSmoke(t *testing.T) {
	e := &env{pki: trusttest.NewPKI(t), bw: 50_000_000 / 8, measure: 100 * time.Millisecond, warm: 50 * time.Millisecond}
	p := path{rtt: 2 * time.Millisecond, loss: 0.005}
	raw := e.run(t, rawQUIC, p, 0)
	for _, im := range []impl{oursNamed("quic", false, ""), oursNamed("yamux", true, "")} {
		res := e.run(t, im, p, 256<<10)
		for name, r := range map[string]result{im.name: res, "raw": raw} {
			if r.connect <= 0 || r.idle.samples < 10 || r.bulk1.samples < 10 || r.bulk4.samples < 10 {
				t.Errorf("%s: %+v: missing round trips", name, r)
			}
			if r.bulk1.mbps <= 0 || r.bulk4.mbps <= 0 {
				t.Errorf("%s: no bulk moved during the pings: %+v", name, r)
			}
			if r.idle.p50 < p.rtt {
				t.Errorf("%s: idle round trip %v below the path's %v RTT: the path is not in the way", name, r.idle.p50, p.rtt)
			}
		}
		if res.cas <= 0 || res.logs <= 0 || res.register <= 0 {
			t.Errorf("%s: cas %.2f MB/s, logs %.2f MB/s, register %v", im.name, res.cas, res.logs, res.register)
		}
	}
}
