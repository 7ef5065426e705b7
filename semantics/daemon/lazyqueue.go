package daemon

import "sync"

// lazyQueue runs queued functions in order on a goroutine that exists only
// while functions are queued: it is started by the push that finds none
// running and returns when it finds the queue empty, so an idle connection
// holds neither goroutine nor stack for it (issue 26 item 1). The queue's
// channel lives as long as its goroutine: the drain that empties it drops
// it, and the next push makes a new one, so an idle connection holds no
// buffer either (64 slots: 0.6 KiB per queue).
//
// A queue that is not empty always has a running goroutine: the drain
// exits only under mu with its channel empty, and push checks under mu
// after each send (a send into a channel whose drain just exited starts a
// new drain of that channel). A full queue makes the pushing goroutine
// wait. One goroutine pushes (the connection's read goroutine, or the one
// it waits for); the zero value is ready.
type lazyQueue struct {
	mu  sync.Mutex
	q   chan func() // the running drain's channel (or the next one's); nil while idle
	run bool        // a drain is running; guarded by mu
	wg  sync.WaitGroup
}

// push queues f behind every function queued before it, waiting while
// size functions are queued; it returns false without queueing f if
// abort is closed first (a nil abort waits).
func (l *lazyQueue) push(size int, f func(), abort <-chan struct{}) bool {
	l.mu.Lock()
	q := l.q
	if q == nil {
		q = make(chan func(), size)
		l.q = q
	}
	l.mu.Unlock()
	select {
	case q <- f:
	case <-abort:
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.run {
		// Either the first push since idle, or the drain of q found it
		// empty and exited between the send's channel read and the send.
		l.run, l.q = true, q
		l.wg.Add(1)
		go l.drain(q)
	}
	return true
}

// drain runs the functions queued on q until it is empty, then drops it.
func (l *lazyQueue) drain(q chan func()) {
	defer l.wg.Done()
	for {
		select {
		case f := <-q:
			f()
		default:
			l.mu.Lock()
			if len(q) == 0 {
				l.run = false
				if l.q == q {
					l.q = nil
				}
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

// idle reports whether the queue holds neither goroutine nor channel.
func (l *lazyQueue) idle() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.run && l.q == nil
}
