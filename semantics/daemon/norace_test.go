//go:build !race

package daemon_test

// raceEnabled: the race detector is on (it changes allocation sizes).
const raceEnabled = false
