package capacity

import (
	"fmt"
	"math"
	"sort"
)

// Fit is the per-daemon cost of one backend fitted to ladder points:
//
//	RSS above idle (bytes)       = RSSPerAgent × n
//	steady CPU (% of one core)   = CPUFixed + CPUPerAgent × n   (at HeartbeatS, LeaseRate)
//	cold start, all registered   = interpolated on log-log between points
//
// RSS per agent is a least-squares slope through the origin (the ladder
// already subtracts the idle RSS); CPU is an ordinary least-squares line
// over the points' total CPU (per-1,000 figure × n / 1,000).
type Fit struct {
	Backend     string  `json:"backend"`
	Points      []int   `json:"points"` // the N of the points used
	RSSPerAgent float64 `json:"rss_per_agent_bytes"`
	CPUFixed    float64 `json:"cpu_fixed_percent"`     // % of one core
	CPUPerAgent float64 `json:"cpu_per_agent_percent"` // % of one core
	HeartbeatS  float64 `json:"heartbeat_interval_s"`  // of the points (the CPU slope's heartbeat rate)
	LeaseRate   float64 `json:"lease_rate_per_s"`      // of the points (inside CPUFixed)
	// Cold start: (N, seconds until all registered), by N.
	Cold [][2]float64 `json:"cold_start"`
}

// FitBackend fits the points of backend; include selects points (nil:
// every point). It needs two points with distinct N.
func FitBackend(in *Inputs, backend string, include func(LadderPoint) bool) (Fit, error) {
	f := Fit{Backend: backend}
	var xs, cpu, rss []float64
	for _, p := range in.Ladder {
		if p.Backend != backend || (include != nil && !include(p)) {
			continue
		}
		n := float64(p.N)
		xs = append(xs, n)
		cpu = append(cpu, p.CPUPercentPer1000*n/1000)
		rss = append(rss, p.RSSPerAgentBytes*n)
		f.Points = append(f.Points, p.N)
		if p.HeartbeatIntervalS > 0 {
			f.HeartbeatS = p.HeartbeatIntervalS
		}
		if p.LeaseRatePerS > 0 {
			f.LeaseRate = p.LeaseRatePerS
		}
		if p.AllRegisteredS > 0 {
			f.Cold = append(f.Cold, [2]float64{n, p.AllRegisteredS})
		}
	}
	distinct := map[float64]bool{}
	for _, x := range xs {
		distinct[x] = true
	}
	if len(distinct) < 2 {
		return f, fmt.Errorf("capacity: backend %s: need ladder points at two different N, have %v", backend, f.Points)
	}
	var sxy, sxx float64
	for i, x := range xs {
		sxy += x * rss[i]
		sxx += x * x
	}
	f.RSSPerAgent = sxy / sxx
	f.CPUFixed, f.CPUPerAgent = linear(xs, cpu)
	if f.HeartbeatS == 0 {
		f.HeartbeatS = 10
	}
	sort.Slice(f.Cold, func(i, j int) bool { return f.Cold[i][0] < f.Cold[j][0] })
	return f, nil
}

// linear is ordinary least squares y = a + b·x.
func linear(xs, ys []float64) (a, b float64) {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	b = (n*sxy - sx*sy) / (n*sxx - sx*sx)
	a = (sy - b*sx) / n
	return a, b
}

// RSS predicts the daemon's RSS above idle with n agents.
func (f Fit) RSS(n float64) float64 { return f.RSSPerAgent * n }

// CPU predicts the daemon's steady CPU (% of one core) with n agents at
// the points' own heartbeat interval and lease rate.
func (f Fit) CPU(n float64) float64 { return f.CPUFixed + f.CPUPerAgent*n }

// ColdStart predicts seconds until n agents started at once are all
// registered: log-log interpolation between the measured points, and
// beyond them the slope of the last two (extrapolated reports that).
func (f Fit) ColdStart(n float64) (s float64, extrapolated bool) {
	c := f.Cold
	switch len(c) {
	case 0:
		return math.NaN(), true
	case 1:
		return c[0][1] * n / c[0][0], n != c[0][0]
	}
	i := sort.Search(len(c), func(i int) bool { return c[i][0] >= n })
	switch {
	case i < len(c) && c[i][0] == n:
		return c[i][1], false
	case i == 0:
		i, extrapolated = 1, true
	case i == len(c):
		i, extrapolated = len(c)-1, true
	}
	x0, y0, x1, y1 := c[i-1][0], c[i-1][1], c[i][0], c[i][1]
	k := math.Log(y1/y0) / math.Log(x1/x0)
	return y0 * math.Pow(n/x0, k), extrapolated
}
