//go:build !unix

package relay_test

import "time"

// cpuTime is not measured here (BenchmarkRelayCPU reports zeros).
func cpuTime() time.Duration { return 0 }
