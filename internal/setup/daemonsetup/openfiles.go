package daemonsetup

import (
	"os"
	"sync"
	"syscall"
	"time"
)

// openFilesEvery bounds how often OpenFiles re-counts the descriptors.
const openFilesEvery = time.Second

// OpenFiles returns daemon.Config.OpenFiles for this process: the open
// descriptors (entries of /proc/self/fd, re-counted at most once a second;
// about 1 ms per 10,000) and the soft RLIMIT_NOFILE. Nil where
// /proc/self/fd does not exist (not Linux): no descriptor check.
func OpenFiles() func() (open, limit int) {
	if _, err := os.Stat("/proc/self/fd"); err != nil {
		return nil
	}
	var (
		mu          sync.Mutex
		at          time.Time
		open, limit int
	)
	return func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		if now := time.Now(); now.Sub(at) >= openFilesEvery {
			at = now
			if n, ok := countFDs(); ok {
				open = n
			}
			var rl syscall.Rlimit
			if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err == nil {
				limit = int(min(rl.Cur, 1<<30))
			}
		}
		return open, limit
	}
}

// countFDs counts the entries of /proc/self/fd.
func countFDs() (int, bool) {
	f, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	n := 0
	for {
		names, err := f.Readdirnames(4096)
		n += len(names)
		if err != nil || len(names) == 0 {
			break
		}
	}
	return n, true
}
