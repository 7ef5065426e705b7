//go:build !race

package daemon_test

// raceEnabled: the test binary runs under the race detector (slower; the
// retained-heap test then measures once instead of three times).
const raceEnabled = false
