package loadgen

import (
	"math"
	"sort"
	"time"
)

// Histogram is a cumulative Prometheus histogram: Cum[i] samples were at
// most Bounds[i] seconds; Count is every sample (the +Inf bucket).
type Histogram struct {
	Bounds []float64
	Cum    []uint64
	Count  uint64
}

// Sub returns h minus an earlier snapshot of the same histogram (the
// samples observed in between).
func (h Histogram) Sub(earlier Histogram) Histogram {
	out := Histogram{Bounds: h.Bounds, Cum: make([]uint64, len(h.Cum)), Count: h.Count - earlier.Count}
	for i := range h.Cum {
		out.Cum[i] = h.Cum[i]
		if i < len(earlier.Cum) {
			out.Cum[i] -= earlier.Cum[i]
		}
	}
	return out
}

// Quantile estimates the q-quantile (0–1) by linear interpolation inside
// its bucket, as Prometheus' histogram_quantile does; 0 without samples.
// Past the last finite bound it returns that bound.
func (h Histogram) Quantile(q float64) time.Duration {
	if h.Count == 0 {
		return 0
	}
	rank := q * float64(h.Count)
	lo, prev := 0.0, uint64(0)
	for i, c := range h.Cum {
		if float64(c) >= rank {
			in := float64(c - prev)
			frac := 1.0
			if in > 0 {
				frac = (rank - float64(prev)) / in
			}
			return secs(lo + (h.Bounds[i]-lo)*frac)
		}
		lo, prev = h.Bounds[i], c
	}
	if len(h.Bounds) == 0 {
		return 0
	}
	return secs(h.Bounds[len(h.Bounds)-1])
}

func secs(s float64) time.Duration { return time.Duration(math.Round(s * float64(time.Second))) }

func sortDurations(d []time.Duration) []time.Duration {
	out := append([]time.Duration(nil), d...)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
