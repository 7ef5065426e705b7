package quic

import (
	"sync"
	"time"

	quicgo "github.com/quic-go/quic-go"
)

// DelayHint estimates, for semantics.BulkHinter, how much data a QUIC
// connection has queued below the application. quic-go has no send queue
// above the socket (a stream Write returns once its data is packetized), so
// the queue a control frame waits behind is data in flight: in the
// receiver's socket buffer and in its in-order packet loop. quic-go does not
// expose bytes in flight, but it does expose RTT samples, and a standing
// queue shows as RTT above the path's minimum. DelayHint converts that
// queueing delay to bytes at the connection's recent send rate:
//
//	queued ≈ (LatestRTT − MinRTT) × send rate
//
// (the Vegas / LEDBAT signal). The semantics scheduler holds bulk chunks
// while the estimate is above its threshold, so the queue stays near the
// threshold instead of filling the receive window. An empty queue reads
// as zero, and the estimate depends on queueing delay, not on RTT, so it
// does not cap throughput by path length the way a small receive window
// does; but RTT samples also rise with the endpoints' scheduling delay, so
// on CPU-starved hosts it holds bulk with no queue ahead of it (measured:
// single-stream bulk halved on the loaded 2-core benchmark machine,
// docs/perf/backends.md §2).
//
// The hint is active only while the path's minimum RTT is at most maxRTT:
// a delay-based hold yields to loss-based competing traffic (it is a
// scavenger), which is wanted on a LAN, where any standing queue is
// self-inflicted, and not on a shared WAN bottleneck.
//
// The zero value is not usable; see NewDelayHint. Safe for concurrent use.
type DelayHint struct {
	qc     *quicgo.Conn
	maxRTT time.Duration

	mu        sync.Mutex
	lastT     time.Time
	lastBytes uint64
	rate      float64 // bytes per second, decaying maximum of recent samples
}

// rateInterval is the shortest interval over which DelayHint samples the
// send rate.
const rateInterval = 2 * time.Millisecond

// NewDelayHint returns a DelayHint for qc, active while qc's minimum RTT
// is at most maxRTT (Config.DelayHintMaxRTT).
func NewDelayHint(qc *quicgo.Conn, maxRTT time.Duration) *DelayHint {
	return &DelayHint{qc: qc, maxRTT: maxRTT}
}

// QueuedBytes implements semantics.BulkHinter. It returns 0 while the
// path's minimum RTT is above maxRTT (or unknown).
func (h *DelayHint) QueuedBytes() int {
	st := h.qc.ConnectionStats()
	if st.MinRTT <= 0 || st.MinRTT > h.maxRTT {
		return 0
	}
	now := time.Now()
	h.mu.Lock()
	if h.lastT.IsZero() {
		h.lastT, h.lastBytes = now, st.BytesSent
	} else if el := now.Sub(h.lastT); el >= rateInterval {
		sample := float64(st.BytesSent-h.lastBytes) / el.Seconds()
		// A decaying maximum: holding bulk back lowers the send rate of
		// the next interval, which must not read as a slower path.
		h.rate = max(sample, h.rate*7/8)
		h.lastT, h.lastBytes = now, st.BytesSent
	}
	rate := h.rate
	h.mu.Unlock()
	q := st.LatestRTT - st.MinRTT
	if q <= 0 || rate <= 0 {
		return 0
	}
	return int(rate * q.Seconds())
}
