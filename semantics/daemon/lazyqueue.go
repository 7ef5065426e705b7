package daemon

import "sync"

// lazyQueue runs queued functions in order on a goroutine that exists only
// while functions are queued: it is started by the push that finds none
// running and returns when it finds the queue empty, so an idle connection
// holds neither goroutine nor stack for it (issue 26 item 1). A queue that
// is not empty always has a running goroutine (it exits only under mu with
// the queue empty, and push checks under mu after each send), so a full
// queue still makes the pushing goroutine wait. One goroutine pushes (the
// connection's read goroutine); the zero value is ready, the channel is
// made on first use.
type lazyQueue struct {
	q   chan func()
	mu  sync.Mutex
	run bool
	wg  sync.WaitGroup
}

// push queues f behind every function queued before it, waiting while
// size functions are queued; it returns false without queueing f if
// abort is closed first (a nil abort waits).
func (l *lazyQueue) push(size int, f func(), abort <-chan struct{}) bool {
	if l.q == nil {
		l.q = make(chan func(), size)
	}
	select {
	case l.q <- f:
	case <-abort:
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.run {
		l.run = true
		l.wg.Add(1)
		go l.drain()
	}
	return true
}

// drain runs the queued functions until the queue is empty.
func (l *lazyQueue) drain() {
	defer l.wg.Done()
	for {
		select {
		case f := <-l.q:
			f()
		default:
			l.mu.Lock()
			if len(l.q) == 0 {
				l.run = false
				l.mu.Unlock()
				return
			}
			l.mu.Unlock()
		}
	}
}

// wait returns once every queued function has run. The pusher calls it
// after its last push.
func (l *lazyQueue) wait() { l.wg.Wait() }
