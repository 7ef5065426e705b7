package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// direction names which way bytes flow.
type direction int

const (
	toDaemon direction = iota
	toAgent
)

func (d direction) String() string {
	if d == toDaemon {
		return "to_daemon"
	}
	return "to_agent"
}

// pair is one relayed agent connection and its upstream connection.
type pair struct {
	r        *Relay
	agent    semantics.BackendConn
	up       semantics.BackendConn
	backend  string
	pace     [2]*pacer // by destination direction
	bytes    [2]prometheus.Counter
	streamsM [2]prometheus.Counter // by opener: toDaemon = agent-opened

	ctx    context.Context // done when either side closed or the relay shuts down
	cancel context.CancelFunc

	mu      sync.Mutex
	streams int              // stream slots in use
	pumps   [2]int           // copy goroutines by direction
	drained [2]chan struct{} // nil, or closed and cleared when pumps[d] reaches 0
	wg      sync.WaitGroup
}

func newPair(r *Relay, agent, up semantics.BackendConn, backend string) *pair {
	p := &pair{r: r, agent: agent, up: up, backend: backend}
	p.pace[toDaemon] = newPacer(up, r.cfg.BulkQueueThreshold, r.cfg.BulkMaxWait)
	p.pace[toAgent] = newPacer(agent, r.cfg.BulkQueueThreshold, r.cfg.BulkMaxWait)
	p.bytes[toDaemon] = r.m.bytes.WithLabelValues(backend, toDaemon.String())
	p.bytes[toAgent] = r.m.bytes.WithLabelValues(backend, toAgent.String())
	p.streamsM[toDaemon] = r.m.streams.WithLabelValues(backend, "agent")
	p.streamsM[toAgent] = r.m.streams.WithLabelValues(backend, "daemon")
	p.ctx, p.cancel = context.WithCancel(r.ctx)
	return p
}

// side returns the source and destination connections of bytes flowing d.
func (p *pair) side(d direction) (src, dst semantics.BackendConn) {
	if d == toDaemon {
		return p.agent, p.up
	}
	return p.up, p.agent
}

// run relays until one side closes, then closes the other with the same
// code and waits for every goroutine of the pair.
func (p *pair) run() {
	for _, d := range []direction{toDaemon, toAgent} {
		p.wg.Add(2)
		go p.acceptBidi(d)
		go p.acceptUni(d)
	}
	var from direction
	var cause error
	select {
	case <-p.agent.Context().Done():
		from, cause = toDaemon, context.Cause(p.agent.Context())
	case <-p.up.Context().Done():
		from, cause = toAgent, context.Cause(p.up.Context())
	case <-p.r.ctx.Done():
		_ = p.agent.CloseWithCode(wire.CloseShutdown, "relay shutting down")
		_ = p.up.CloseWithCode(wire.CloseShutdown, "relay shutting down")
	}
	if cause != nil {
		// Let the copies from the closed side finish writing what they
		// already read (a GoAway, a final log frame) before the close.
		p.waitDrained(from, p.r.cfg.CloseGrace)
		code, reason := closeOf(cause)
		_, dst := p.side(from)
		if from == toAgent {
			p.r.cfg.Logger.Debug("relay: daemon closed; closing agent", "backend", p.backend, "code", code, "reason", reason)
		} else {
			p.r.cfg.Logger.Debug("relay: agent closed; closing daemon side", "backend", p.backend, "code", code, "reason", reason)
		}
		_ = dst.CloseWithCode(code, reason)
	}
	p.cancel()
	// Whatever happened, both sides are closed now (CloseWithCode is
	// idempotent), so every accept and copy goroutine returns.
	_ = p.agent.CloseWithCode(wire.CloseShutdown, "relay shutting down")
	_ = p.up.CloseWithCode(wire.CloseShutdown, "relay shutting down")
	p.wg.Wait()
}

// closeOf returns the code and reason to forward for a close cause.
func closeOf(cause error) (wire.CloseCode, string) {
	var ce *semantics.ConnError
	if errors.As(cause, &ce) {
		if ce.Remote {
			return ce.Code, ce.Reason
		}
		// Detected by the relay itself (idle timeout, write stall).
		return ce.Code, wire.TruncateUTF8("relay: "+ce.Error(), wire.MaxCloseReason)
	}
	return wire.CloseInternalError, wire.TruncateUTF8(fmt.Sprintf("relay: connection failed: %v", cause), wire.MaxCloseReason)
}

// waitDrained waits until no copy goroutine of direction d runs, or max.
func (p *pair) waitDrained(d direction, max time.Duration) {
	t := time.NewTimer(max)
	defer t.Stop()
	for {
		p.mu.Lock()
		if p.pumps[d] == 0 {
			p.mu.Unlock()
			return
		}
		if p.drained[d] == nil {
			p.drained[d] = make(chan struct{})
		}
		ch := p.drained[d]
		p.mu.Unlock()
		select {
		case <-ch:
		case <-t.C:
			return
		}
	}
}

func (p *pair) pumpStart(d direction) {
	p.mu.Lock()
	p.pumps[d]++
	p.mu.Unlock()
}

func (p *pair) pumpEnd(d direction) {
	p.mu.Lock()
	p.pumps[d]--
	if p.pumps[d] == 0 && p.drained[d] != nil {
		close(p.drained[d])
		p.drained[d] = nil
	}
	p.mu.Unlock()
}

// acquire takes a stream slot; false when the per-connection limit is
// reached.
func (p *pair) acquire() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.streams >= p.r.cfg.MaxStreamsPerConn {
		return false
	}
	p.streams++
	return true
}

func (p *pair) release() {
	p.mu.Lock()
	p.streams--
	p.mu.Unlock()
}

func (p *pair) refuse(d direction) {
	p.r.st.streamsRefused.Add(1)
	p.r.m.refused.WithLabelValues(p.backend, "stream").Inc()
	if d == toDaemon {
		p.r.cfg.Logger.Info("relay: agent stream over the per-connection limit refused", "backend", p.backend,
			"remote", p.agent.RemoteAddr().String(), "max_streams", p.r.cfg.MaxStreamsPerConn)
	}
}

// acceptLoop accepts the streams the source of d opens (accept is its
// AcceptStream or AcceptUniStream) until the pair ends. A stream over the
// per-connection limit is counted and logged by p.refuse and reset by
// refuse; every other one is relayed by relay in its own goroutine, which
// holds a stream slot and is counted as a pump of d from its start (relay
// ends that pump).
func acceptLoop[S any](p *pair, d direction, accept func(context.Context) (S, error), refuse func(S), relay func(S)) {
	defer p.wg.Done()
	for {
		s, err := accept(p.ctx)
		if err != nil {
			return
		}
		if !p.acquire() {
			p.refuse(d)
			refuse(s)
			continue
		}
		p.wg.Add(1)
		p.pumpStart(d)
		go func() {
			defer p.wg.Done()
			defer p.release()
			relay(s)
		}()
	}
}

// acceptBidi relays bidirectional streams opened by the source of d.
func (p *pair) acceptBidi(d direction) {
	src, dst := p.side(d)
	acceptLoop(p, d, src.AcceptStream, func(s semantics.RawStream) {
		s.CancelRead(semantics.StreamRefused)
		s.CancelWrite(semantics.StreamRefused)
	}, func(s semantics.RawStream) {
		hdr, kind, ok := p.readHeader(s, func(c semantics.StreamErrorCode) { s.CancelRead(c); s.CancelWrite(c) })
		if !ok {
			p.pumpEnd(d)
			return
		}
		out, err := dst.OpenStream(p.ctx)
		if err != nil {
			s.CancelRead(semantics.StreamCancelled)
			s.CancelWrite(semantics.StreamCancelled)
			p.pumpEnd(d)
			return
		}
		p.counted(d)
		rev := toAgent
		if d == toAgent {
			rev = toDaemon
		}
		p.pumpStart(rev)
		var inner sync.WaitGroup
		inner.Add(1)
		go func() {
			defer inner.Done()
			defer p.pumpEnd(rev)
			p.copy(rev, s, out, nil, kind)
		}()
		p.copy(d, out, s, hdr, kind)
		p.pumpEnd(d)
		inner.Wait()
	})
}

// acceptUni relays unidirectional streams opened by the source of d.
func (p *pair) acceptUni(d direction) {
	src, dst := p.side(d)
	acceptLoop(p, d, src.AcceptUniStream, func(s semantics.RawRecvStream) {
		s.CancelRead(semantics.StreamRefused)
	}, func(s semantics.RawRecvStream) {
		defer p.pumpEnd(d)
		hdr, kind, ok := p.readHeader(s, s.CancelRead)
		if !ok {
			return
		}
		out, err := dst.OpenUniStream(p.ctx)
		if err != nil {
			s.CancelRead(semantics.StreamCancelled)
			return
		}
		p.counted(d)
		p.copy(d, out, s, hdr, kind)
	})
}

func (p *pair) counted(d direction) {
	p.r.st.streams.Add(1)
	p.streamsM[d].Inc()
}

// readHeader reads the StreamHeader frame that opens every stream (§40),
// bounded by HeaderTimeout, and returns its raw bytes (forwarded verbatim)
// and the kind, which decides the stream's priority. A stream whose header
// is malformed is still forwarded verbatim (the endpoint judges it, §184)
// and treated as bulk; one that does not deliver a header in time is
// cancelled with reset (StreamProtocolError), as is one whose peer gives
// up first.
func (p *pair) readHeader(s semantics.RawRecvStream, reset func(semantics.StreamErrorCode)) ([]byte, wire.StreamKind, bool) {
	_ = s.SetReadDeadline(time.Now().Add(p.r.cfg.HeaderTimeout))
	defer func() { _ = s.SetReadDeadline(time.Time{}) }()
	buf := make([]byte, 1, 1+wire.MaxStreamHeaderFrame)
	if _, err := io.ReadFull(s, buf); err != nil {
		p.headerFailed(err, reset)
		return nil, 0, false
	}
	n := int(buf[0])
	if n == 0 || n > wire.MaxStreamHeaderFrame { // a one-byte varint below 64
		return buf, wire.StreamCasUpload, true // malformed: forward, lowest priority
	}
	buf = buf[:1+n]
	if _, err := io.ReadFull(s, buf[1:]); err != nil {
		p.headerFailed(err, reset)
		return nil, 0, false
	}
	h, err := wire.ParseStreamHeader(buf[1:])
	if err != nil {
		return buf, wire.StreamCasUpload, true
	}
	return buf, h.Kind, true
}

func (p *pair) headerFailed(err error, reset func(semantics.StreamErrorCode)) {
	var se *semantics.StreamError
	switch {
	case errors.As(err, &se):
		reset(se.Code) // the opener gave up; nothing was opened on the other side
	case errors.Is(err, semantics.ErrDeadline):
		reset(semantics.StreamProtocolError)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		reset(semantics.StreamProtocolError)
	default: // the connection closed
		reset(semantics.StreamCancelled)
	}
}

// copy moves bytes from src to dst (direction d) until src ends: a FIN
// becomes a FIN, a reset (RESET_STREAM) becomes a reset with the same
// code, and a STOP_SENDING from dst's peer becomes a STOP_SENDING on src
// with the same code. prefix (the stream header) is written first.
func (p *pair) copy(d direction, dst semantics.RawSendStream, src semantics.RawRecvStream, prefix []byte, kind wire.StreamKind) {
	pace := p.pace[d]
	bulk := semantics.DefaultPriority(kind).IsBulk()
	counter := &p.r.st.toDaemon
	if d == toAgent {
		counter = &p.r.st.toAgent
	}
	write := func(b []byte) error {
		for len(b) > 0 {
			n := len(b)
			var tok uint64
			if bulk {
				n = min(n, DefaultBulkChunk)
				pace.waitBulk()
			} else {
				tok = pace.beginUrgent()
			}
			m, err := dst.Write(b[:n])
			if !bulk {
				pace.endUrgent(tok)
			}
			if m > 0 {
				counter.Add(int64(m))
				p.bytes[d].Add(float64(m))
			}
			if err != nil {
				return err
			}
			b = b[n:]
		}
		return nil
	}
	onWriteErr := func(err error) {
		var se *semantics.StreamError
		var ce *semantics.ConnError
		switch {
		case errors.As(err, &se) && se.Remote:
			src.CancelRead(se.Code) // STOP_SENDING from dst's peer
		case errors.As(err, &se):
			src.CancelRead(se.Code) // reset locally (the reverse copy failed)
		case errors.As(err, &ce):
			// dst's connection closed; run() closes src's with its code.
		default:
			src.CancelRead(semantics.StreamInternalError)
			dst.CancelWrite(semantics.StreamInternalError)
		}
	}
	if len(prefix) > 0 {
		if err := write(prefix); err != nil {
			onWriteErr(err)
			return
		}
	}
	buf := p.r.getBuf()
	defer p.r.putBuf(buf)
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			if err := write(buf[:n]); err != nil {
				onWriteErr(err)
				return
			}
		}
		if rerr != nil {
			var se *semantics.StreamError
			switch {
			case rerr == io.EOF:
				_ = dst.Close() // FIN → FIN
			case errors.As(rerr, &se):
				if se.Remote {
					dst.CancelWrite(se.Code) // RESET_STREAM → RESET_STREAM
				} else {
					dst.CancelWrite(semantics.StreamCancelled)
				}
			default:
				// src's connection closed: leave dst's stream alone, so its
				// peer learns the close code from the connection close that
				// run() sends, not a stream reset.
			}
			return
		}
	}
}

func (r *Relay) getBuf() []byte {
	if b, ok := r.bufs.Get().(*[]byte); ok {
		return *b
	}
	return make([]byte, r.cfg.CopyBuffer)
}

func (r *Relay) putBuf(b []byte) {
	r.bufs.Put(&b)
}
