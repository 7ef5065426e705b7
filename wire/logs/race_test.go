//go:build race

package logs

// raceEnabled: the race detector makes sync.Pool drop items at random, so
// pooled-allocation assertions do not hold under -race.
const raceEnabled = true
