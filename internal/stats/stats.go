// Package stats holds the one percentile of the module's measurements
// (benchmarks, the scale harness, the WAN bench, the latency figures of
// the engine tests): nearest rank, the definition docs/perf.md quotes.
package stats

import (
	"cmp"
	"math"
	"slices"
)

// Percentile returns the p-th percentile (0–100) of sorted samples by the
// nearest-rank method: the smallest sample at or above p % of them
// (p 50 of 1..10 is 5, p 99 is 10, p 0 is the minimum); 0 for none.
// Samples are durations in most callers, byte counts in some.
func Percentile[T cmp.Ordered](sorted []T, p float64) T {
	if len(sorted) == 0 {
		var zero T
		return zero
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// PercentileOf is Percentile of samples in any order (it sorts a copy).
func PercentileOf[T cmp.Ordered](samples []T, p float64) T {
	s := slices.Clone(samples)
	slices.Sort(s)
	return Percentile(s, p)
}
