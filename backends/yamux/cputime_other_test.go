//go:build !unix

package yamux

import "time"

// cpuTime is not measured here: the cpu-s/GiB metric is left out.
func cpuTime() time.Duration { return 0 }
