package stats

import (
	"testing"
	"time"
)

// TestPercentileNearestRank: the nearest-rank definition on 1..10 and on
// edge cases.
func TestPercentileNearestRank(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 10; i++ {
		s = append(s, time.Duration(i))
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{0, 1}, {10, 1}, {11, 2}, {50, 5}, {90, 9}, {99, 10}, {100, 10}, {150, 10}, {-5, 1}} {
		if got := Percentile(s, c.p); got != c.want {
			t.Errorf("Percentile(1..10, %v) = %v, want %v", c.p, got, c.want)
		}
	}
	if got := Percentile[time.Duration](nil, 50); got != 0 {
		t.Errorf("Percentile(none) = %v, want 0", got)
	}
	shuffled := []time.Duration{7, 3, 9, 1, 5}
	if got := PercentileOf(shuffled, 50); got != 5 || shuffled[0] != 7 {
		t.Errorf("PercentileOf = %v (input now %v), want 5 and the input untouched", got, shuffled)
	}
}
