package yamux

import (
	"sync"
	"syscall"

	"forgeyard.dev/transport/semantics"
)

// The socket's unsent bytes without a system call per bulk chunk (issue 26
// item 4).
//
// The semantics scheduler reads QueuedBytes before every bulk chunk (16 KiB
// by default). Reading the kernel's figure (ioctl SIOCOUTQNSD) each time was
// 8–10 % of a one-stream bulk profile, the largest cost ours had over raw
// yamux. Between two reads the unsent queue can only grow by what this
// side wrote, so notSentEstimate answers with an upper bound, the last read
// plus the bytes the socket accepted since (batchConn.written), and reads
// the kernel again only when
//
//   - the bound exceeds slack (at most semantics.DefaultBulkQueueThreshold,
//     so with the default threshold a bound never holds a chunk back that
//     a fresh read would let pass), or
//   - nothing was written since the previous call: a scheduler polling
//     while it waits gets a fresh figure each time, so a stale bound cannot
//     hold bulk back for longer than one poll.
//
// The answer is never below the kernel's figure at the time of the call, so
// control frames never wait behind more than the scheduler's threshold. A
// bound followed by a call with nothing written or begun in between (a
// poll: the bound held a chunk back, so the scheduler's threshold,
// semantics.Config.BulkQueueThreshold, is below slack) halves slack; 64
// bounds in a row that were followed by a write double it again (up to
// notSentSlack), so a misjudged poll (a chunk held by a control write
// instead) costs reads for a while, not for the connection's life.
type notSentEstimate struct {
	mu    sync.Mutex
	init  bool
	slack int
	base  int   // the kernel's unsent bytes at the last read
	baseW int64 // batchConn.written just before that read
	seenW int64 // batchConn.written at the previous call
	seenS int64 // Conn.writeSeq at the previous call
	stale int   // the previous call's answer if it was a bound above 0
	kept  int   // bounds followed by a write since slack last changed
}

// notSentSlack is the largest bound notSentEstimate answers without a
// fresh read.
const notSentSlack = semantics.DefaultBulkQueueThreshold

// notSentKeep is how many bounds in a row must be followed by a write
// before slack doubles again.
const notSentKeep = 64

// notSent returns the socket's unsent bytes or an upper bound on them.
func (c *Conn) notSent() int {
	if c.raw == nil {
		return 0
	}
	if c.sc.bc == nil {
		return notSentBytes(c.raw)
	}
	return c.nse.get(c.sc.bc.written.Load(), c.writeSeq.Load(), c.raw, notSentBytes)
}

// get answers for a socket that has accepted w bytes so far, with seq
// stream writes begun; read reads the kernel's figure.
func (e *notSentEstimate) get(w, seq int64, raw syscall.RawConn, read func(syscall.RawConn) int) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	idle := e.init && w == e.seenW && seq == e.seenS
	if !e.init {
		e.init, e.slack = true, notSentSlack
	}
	if e.stale > 0 {
		if idle {
			e.slack, e.kept = min(e.slack, e.stale)/2, 0
		} else if e.kept++; e.kept >= notSentKeep {
			e.slack, e.kept = min(2*max(e.slack, 1), notSentSlack), 0
		}
	}
	e.seenW, e.seenS = w, seq
	if !idle {
		if bound := e.base + int(w-e.baseW); bound <= e.slack {
			e.stale = bound
			return bound
		}
	}
	e.stale, e.baseW = 0, w
	e.base = read(raw)
	return e.base
}
