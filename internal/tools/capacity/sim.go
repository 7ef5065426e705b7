package capacity

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// SimConfig is a discrete-event simulation of the authority database's
// load: every agent's presence touches, every attempt's create, accept,
// renewals and completion, and registrations, each at its own instant,
// against the measured ceilings (Evaluate's DBOps). The database is a
// single server that does 1 s of work per second; an operation costs
// 1/ceiling s (its share of the measured throughput), work queues when it
// arrives faster (a fluid queue in bins of BinS). Seeded: the same config
// gives the same result.
type SimConfig struct {
	K        int     // daemons (all up)
	HorizonS float64 // simulated seconds measured (after the attempts in flight at 0 were placed)
	BinS     float64 // bin width; 0: 0.1 s
	Seed     uint64
	// Herd: every daemon restarted at 0, so its agents register again at
	// admission.registration_rate (agent j of a daemon at j / rate): the
	// presence touches, and the renewals of the attempts in flight (their
	// timers restart at the reconnection), line up behind the
	// registrations. Otherwise every agent's phase is uniform (steady).
	Herd bool
}

// SimResult is what the simulation measured.
type SimResult struct {
	MeanUtil    float64        `json:"mean_util"`     // work / time over the horizon
	Peak1sUtil  float64        `json:"peak_1s_util"`  // the busiest second
	MaxBacklogS float64        `json:"max_backlog_s"` // the most work queued: the wait it adds
	EndBacklogS float64        `json:"end_backlog_s"` // still queued at the end (> 0: falls behind)
	Ops         map[string]int `json:"ops"`           // operations in the horizon, by kind
	RegWindowS  float64        `json:"reg_window_s"`  // herd: the last registration
}

// Simulate runs the simulation for the model's workload on cfg.K daemons.
func (m *Model) Simulate(cfg SimConfig) (SimResult, error) {
	if cfg.K < 1 || cfg.HorizonS <= 0 {
		return SimResult{}, fmt.Errorf("capacity: simulate needs k ≥ 1 and a horizon > 0")
	}
	if cfg.BinS <= 0 {
		cfg.BinS = 0.1
	}
	w, d := m.W, m.D
	ev := m.Evaluate(cfg.K)
	cost := map[string]float64{}
	for _, o := range ev.DBOps {
		cost[o.Op] = 1 / o.CeilingPerS
	}
	const (
		opCreate   = "create lease"
		opAccept   = "accept lease"
		opRenew    = "renew lease"
		opComplete = "complete attempt"
		opRegister = "register (+resync)"
		opTouch    = "presence heartbeat touch"
		opPresence = "presence + capabilities at registration, presence at disconnect"
	)
	nb := int(math.Ceil(cfg.HorizonS / cfg.BinS))
	work := make([]float64, nb)
	res := SimResult{Ops: map[string]int{}}
	add := func(t float64, op string, times float64) {
		if t < 0 || t >= cfg.HorizonS {
			return
		}
		work[int(t/cfg.BinS)] += cost[op] * times
		res.Ops[op] += int(times)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5eed))
	N := w.Agents
	perD := int(math.Ceil(float64(N) / float64(cfg.K)))
	hb := w.HeartbeatInterval(float64(perD))
	P := PresencePeriod(hb)

	// Agents: registration instant (herd) or phase (steady).
	reg := make([]float64, N)
	for i := range N {
		if cfg.Herd {
			j := i / cfg.K // agent i is the j-th of daemon i mod K
			reg[i] = float64(j) / d.RegistrationRate
			res.RegWindowS = math.Max(res.RegWindowS, reg[i])
			add(reg[i], opRegister, 1)
			add(reg[i], opPresence, 2) // presence and capabilities
		} else {
			reg[i] = -rng.Float64() * P
		}
		for t := reg[i] + P; t < cfg.HorizonS; t += P {
			add(t, opTouch, 1)
		}
	}
	// Reconnect churn (steady registrations), Poisson.
	if regs := float64(N) * w.ReconnectsPerAgentHour / 3600; regs > 0 && !cfg.Herd {
		for t := rng.ExpFloat64() / regs; t < cfg.HorizonS; t += rng.ExpFloat64() / regs {
			add(t, opRegister, 1)
			add(t, opPresence, 3)
		}
	}
	// Attempts: Poisson arrivals from well before 0, exponential durations.
	lambda := float64(N) * w.LeasesPerAgentHour / 3600
	R := w.RenewIntervalS
	if lambda > 0 {
		start := -10 * w.AttemptSeconds
		for a := start + rng.ExpFloat64()/lambda; a < cfg.HorizonS; a += rng.ExpFloat64() / lambda {
			dur := rng.ExpFloat64() * w.AttemptSeconds
			end := a + dur
			if end < 0 {
				continue
			}
			add(a, opCreate, 1)
			add(a, opAccept, 1)
			add(end, opComplete, 1)
			if R <= 0 {
				continue
			}
			first := a + R
			if cfg.Herd && a < 0 {
				// In flight at the restart: the agent renews from its
				// reconnection on.
				first = reg[rng.IntN(N)] + R
			}
			for t := first; t < end; t += R {
				add(t, opRenew, 1)
			}
		}
	}
	var total, backlog float64
	perSec := int(math.Round(1 / cfg.BinS))
	var sec float64
	for i, x := range work {
		total += x
		backlog = math.Max(0, backlog+x-cfg.BinS)
		res.MaxBacklogS = math.Max(res.MaxBacklogS, backlog)
		sec += x
		if (i+1)%perSec == 0 {
			res.Peak1sUtil = math.Max(res.Peak1sUtil, sec)
			sec = 0
		}
	}
	res.MeanUtil = total / (float64(nb) * cfg.BinS)
	res.EndBacklogS = backlog
	return res, nil
}
