//go:build !race

package logs

const raceEnabled = false
