// Package control runs the agent control stream: one bidirectional
// semantics stream of kind wire.StreamControl that carries every
// agent-family message as an envelope frame (§39, §41). Both the daemon and
// the agent use a Channel:
//
//   - Send writes an envelope with a fresh MessageId (or a caller-chosen one
//     for retries, which must reuse the MessageId, §31, §77) at a chosen
//     priority (cancellation goes first, §132);
//   - Reply and ReplyError answer a request (CorrelationId = the request's
//     MessageId, §32; errors are WireErrorV1, §262–265);
//   - Call sends a request and waits, with a deadline, for the envelope that
//     correlates to it (§124–125). The table of outstanding calls is
//     bounded (MaxPending);
//   - Run is the read loop: it decodes and validates every frame, hands
//     responses to their waiting Call and everything else to a handler.
package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
	"forgeyard.dev/transport/wire/registry"
)

// Defaults for Config.
const (
	DefaultMaxPending   = 1024
	DefaultWriteTimeout = 10 * time.Second
)

// Alike in shape to the other packages' sentinel-error blocks, but these are
// this package's own failures, each a stable API value: they stay apart.

// Errors.
var (
	// ErrTooManyPending: MaxPending calls are outstanding; retry later.
	ErrTooManyPending = errors.New("control: too many outstanding requests")
	// ErrDuplicateRequest: a Call with the same MessageId is outstanding.
	ErrDuplicateRequest = errors.New("control: request with this MessageId already outstanding")
	// ErrClosed: the channel's read loop ended; its error is wrapped.
	ErrClosed = errors.New("control: channel closed")
)

// TimeoutError is returned by Call when no correlated answer arrived
// within the request's deadline. Its Code is wire.ErrCodeTimeout.
type TimeoutError struct {
	Type  wire.MessageTypeId
	ID    wire.MessageId
	After time.Duration
}

// Error names the request and the deadline.
func (e *TimeoutError) Error() string {
	return fmt.Sprintf("control: request %s (type %s) not answered within %v", e.ID, e.Type, e.After)
}

// Code returns wire.ErrCodeTimeout.
func (e *TimeoutError) Code() wire.ProtocolErrorCode { return wire.ErrCodeTimeout }

// DecodeError is a frame the read loop could not turn into a valid
// message. HasID says whether the envelope header decoded, so the answer
// can correlate to MessageID.
type DecodeError struct {
	HasID     bool
	MessageID wire.MessageId
	Code      wire.ProtocolErrorCode // Malformed, UnknownMessage or InvalidValue
	Err       error
}

// Error returns the code and the decoder's reason.
func (e *DecodeError) Error() string { return "control: " + e.Code.String() + ": " + e.Err.Error() }

// Unwrap returns the decoder error.
func (e *DecodeError) Unwrap() error { return e.Err }

// Config configures a Channel. The zero value is usable.
type Config struct {
	// Registry decodes envelopes; nil means registry.Default.
	Registry *wire.Registry
	// Protocol is written in every envelope; zero means wire.Current. It can
	// be changed after negotiation with SetProtocol.
	Protocol wire.ProtocolVersion
	// MaxPending bounds outstanding Calls; 0 means DefaultMaxPending.
	MaxPending int
	// WriteTimeout bounds every write (flow control may block); 0 means
	// DefaultWriteTimeout.
	WriteTimeout time.Duration
	// Now is the clock for SentAtMs; nil means time.Now.
	Now func() time.Time
	// Logger; nil discards.
	Logger *slog.Logger
	// Metrics, when set, counts every received message by family and
	// outcome (ok: decoded and dispatched; error: failed to decode or
	// validate) and every WireErrorV1 sent or received by code, e.g. a
	// *telemetry.Metrics. Nil, or an interface holding a nil pointer,
	// disables them: no hook is called.
	Metrics semantics.MessageObserver
}

// Stream is what a Channel needs of a control stream; *semantics.Stream
// implements it.
type Stream interface {
	WriteEnvelope(e *wire.Envelope) error
	ReadFrame() ([]byte, error)
	SetPriority(p semantics.Priority)
	Priority() semantics.Priority
	SetWriteDeadline(t time.Time) error
}

var _ Stream = (*semantics.Stream)(nil)

// Channel is one control stream. All methods are safe for concurrent use;
// Run must be called exactly once.
type Channel struct {
	s    Stream
	reg  *wire.Registry
	now  func() time.Time
	wto  time.Duration
	maxP int
	log  *slog.Logger
	m    semantics.MessageObserver // nil: no observer

	wmu   sync.Mutex // serialises writes with their priority
	proto wire.ProtocolVersion

	mu sync.Mutex
	// pending: the requests awaiting their answer; made by the first and
	// dropped by the last (Go's maps keep their memory after deletes, and an
	// idle channel has none pending: issue 26 item 1).
	pending map[wire.MessageId]chan *wire.Envelope
	done    chan struct{}
	err     error

	// The outcome counted for the envelope Run is handing to handle; only
	// Run's goroutine (and handle, which it calls) touch them.
	outcome  semantics.Outcome
	deferred bool
}

// SetOutcome sets the outcome that forgeyard_transport_messages_total
// counts for the message being handled: OutcomeRejected when the handler
// refused it (rate limit, state, role), OutcomeDuplicate for a retry of
// something already handled. Call it only from Run's handle, on Run's
// goroutine; a message whose handler says nothing counts as ok.
func (c *Channel) SetOutcome(o semantics.Outcome) { c.outcome = o }

// DeferOutcome is for a handler that decides the outcome later, off Run's
// goroutine (after an authority call): Run then does not count the message,
// and the returned function counts it exactly once (later calls do
// nothing). Call it only from Run's handle.
func (c *Channel) DeferOutcome(t wire.MessageTypeId) func(semantics.Outcome) {
	c.deferred = true
	var once sync.Once
	return func(o semantics.Outcome) { once.Do(func() { c.handled(t.Family(), o) }) }
}

// forget removes id from the pending requests, dropping the map with the
// last. Called with c.mu held.
func (c *Channel) forget(id wire.MessageId) {
	delete(c.pending, id)
	if len(c.pending) == 0 {
		c.pending = nil
	}
}

// New wraps a control stream.
func New(s Stream, cfg Config) *Channel {
	c := &Channel{s: s, reg: cfg.Registry, now: cfg.Now, wto: cfg.WriteTimeout, maxP: cfg.MaxPending,
		log: cfg.Logger, proto: cfg.Protocol, done: make(chan struct{})}
	if !semantics.IsNilObserver(cfg.Metrics) {
		c.m = cfg.Metrics
	}
	if c.reg == nil {
		c.reg = registry.Default
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.wto <= 0 {
		c.wto = DefaultWriteTimeout
	}
	if c.maxP <= 0 {
		c.maxP = DefaultMaxPending
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.proto == (wire.ProtocolVersion{}) {
		c.proto = wire.Current
	}
	return c
}

// SetProtocol sets the version written in later envelopes.
func (c *Channel) SetProtocol(v wire.ProtocolVersion) {
	c.wmu.Lock()
	c.proto = v
	c.wmu.Unlock()
}

// Out is one outgoing message.
type Out struct {
	// ID is the MessageId; zero means a fresh one. Retries pass the first
	// attempt's ID (§31).
	ID wire.MessageId
	// Correlation, when non-zero, is the MessageId this message answers.
	Correlation wire.MessageId
	// Priority of this write; zero value PriorityCancel is not a sensible
	// default, so set UsePriority to apply it. Without UsePriority the
	// stream's own priority applies.
	Priority    semantics.Priority
	UsePriority bool
	Msg         wire.Message
	// Trace, when HasTrace, is written as the envelope's W3C trace
	// context (§211). Set it only when FeatureTraceContextV1 was
	// negotiated (telemetry.Inject builds it from a span context).
	Trace    wire.TraceContext
	HasTrace bool
}

// Send writes o and returns its MessageId.
func (c *Channel) Send(o Out) (wire.MessageId, error) {
	if o.ID == (wire.MessageId{}) {
		o.ID = wire.NewMessageId()
	}
	env := wire.Envelope{MessageID: o.ID, SentAtMs: uint64(c.now().UnixMilli()), Payload: o.Msg}
	if o.Correlation != (wire.MessageId{}) {
		env.WithCorrelation(wire.CorrelationId(o.Correlation))
	}
	env.Trace, env.HasTrace = o.Trace, o.HasTrace
	if we, ok := o.Msg.(*wire.WireErrorV1); ok && c.m != nil {
		c.m.ProtocolError(we.Code)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	env.Protocol = c.proto
	if o.UsePriority {
		prev := c.s.Priority()
		c.s.SetPriority(o.Priority)
		defer c.s.SetPriority(prev)
	}
	_ = c.s.SetWriteDeadline(time.Now().Add(c.wto))
	err := c.s.WriteEnvelope(&env)
	_ = c.s.SetWriteDeadline(time.Time{})
	return o.ID, err
}

// SendMsg writes m with a fresh MessageId at the stream's priority.
func (c *Channel) SendMsg(m wire.Message) (wire.MessageId, error) { return c.Send(Out{Msg: m}) }

// Reply answers the request req (which may be nil for unsolicited messages).
func (c *Channel) Reply(req *wire.Envelope, m wire.Message) error {
	o := Out{Msg: m}
	if req != nil {
		o.Correlation = req.MessageID
	}
	_, err := c.Send(o)
	return err
}

// ReplyOut answers the request req with o (for a trace context or a
// priority); o.Correlation is set to req's MessageId when req is not nil.
func (c *Channel) ReplyOut(req *wire.Envelope, o Out) error {
	if req != nil {
		o.Correlation = req.MessageID
	}
	_, err := c.Send(o)
	return err
}

// ReplyError answers with a WireErrorV1. id may be zero (no correlation).
func (c *Channel) ReplyError(id wire.MessageId, code wire.ProtocolErrorCode, retry wire.RetryClass, msg string) error {
	_, err := c.Send(Out{Correlation: id, Msg: &wire.WireErrorV1{Code: code, Retry: retry, Message: msg}})
	return err
}

// Call sends o and waits up to timeout (and ctx) for the envelope that
// correlates to o's MessageId. A WireErrorV1 answer is returned as the
// error (*wire.WireErrorV1). A missing answer is a *TimeoutError; a closed
// channel wraps ErrClosed.
func (c *Channel) Call(ctx context.Context, o Out, timeout time.Duration) (*wire.Envelope, error) {
	if o.ID == (wire.MessageId{}) {
		o.ID = wire.NewMessageId()
	}
	ch := make(chan *wire.Envelope, 1)
	c.mu.Lock()
	switch {
	case c.err != nil:
		err := c.err
		c.mu.Unlock()
		return nil, err
	case len(c.pending) >= c.maxP:
		c.mu.Unlock()
		return nil, ErrTooManyPending
	}
	if _, dup := c.pending[o.ID]; dup {
		c.mu.Unlock()
		return nil, ErrDuplicateRequest
	}
	if c.pending == nil {
		c.pending = make(map[wire.MessageId]chan *wire.Envelope)
	}
	c.pending[o.ID] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.forget(o.ID)
		c.mu.Unlock()
	}()
	if _, err := c.Send(o); err != nil {
		return nil, err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case env := <-ch:
		if we, ok := env.Payload.(*wire.WireErrorV1); ok {
			return env, we
		}
		return env, nil
	case <-t.C:
		return nil, &TimeoutError{Type: o.Msg.MessageType(), ID: o.ID, After: timeout}
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.done:
		select { // an answer delivered just before the end still counts
		case env := <-ch:
			if we, ok := env.Payload.(*wire.WireErrorV1); ok {
				return env, we
			}
			return env, nil
		default:
		}
		return nil, c.Err()
	}
}

// Done is closed when the read loop ended.
func (c *Channel) Done() <-chan struct{} { return c.done }

// Err returns the read loop's end (wrapping ErrClosed), or nil while it runs.
func (c *Channel) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Run reads frames until the stream fails. Envelopes that correlate to an
// outstanding Call go to that Call; all others go to handle, in order, on
// Run's goroutine (handle must not Call on this channel). Frames that fail
// to decode or validate go to bad; a bad frame does not stop the loop.
// Run returns the stream error, wrapped with ErrClosed.
func (c *Channel) Run(handle func(*wire.Envelope), bad func(*DecodeError)) error {
	for {
		b, err := c.s.ReadFrame()
		if err != nil {
			err = fmt.Errorf("%w: %w", ErrClosed, err)
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
			close(c.done)
			return err
		}
		env, derr := c.decode(b)
		if derr != nil {
			c.handled(wire.NumFamilies, semantics.OutcomeError) // family unknown: the payload did not decode
			if bad != nil {
				bad(derr)
			}
			continue
		}
		if we, ok := env.Payload.(*wire.WireErrorV1); ok && c.m != nil {
			c.m.ProtocolError(we.Code)
		}
		if env.HasCorrelation {
			c.mu.Lock()
			ch, ok := c.pending[wire.MessageId(env.CorrelationID)]
			if ok {
				c.forget(wire.MessageId(env.CorrelationID))
			}
			c.mu.Unlock()
			if ok {
				c.handled(env.Payload.MessageType().Family(), semantics.OutcomeOK)
				ch <- env // buffered, one answer per call
				continue
			}
		}
		c.outcome, c.deferred = semantics.OutcomeOK, false
		handle(env)
		if !c.deferred {
			c.handled(env.Payload.MessageType().Family(), c.outcome)
		}
	}
}

// handled reports one message to the observer, if any.
func (c *Channel) handled(f wire.Family, o semantics.Outcome) {
	if c.m != nil {
		c.m.MessageHandled(f, o)
	}
}

func (c *Channel) decode(b []byte) (*wire.Envelope, *DecodeError) {
	var env wire.Envelope
	d := postcard.NewDecoder(b)
	env.DecodeHeader(&d)
	if err := d.Err(); err != nil {
		return nil, &DecodeError{Code: wire.ErrCodeMalformed, Err: err}
	}
	m, err := c.reg.DecodeMessage(&d)
	if err != nil {
		code := wire.ErrCodeMalformed
		var um *wire.UnknownMessageError
		if errors.As(err, &um) {
			code = wire.ErrCodeUnknownMessage
		}
		return nil, &DecodeError{HasID: true, MessageID: env.MessageID, Code: code, Err: err}
	}
	if err := m.Validate(); err != nil {
		return nil, &DecodeError{HasID: true, MessageID: env.MessageID, Code: wire.ErrCodeInvalidValue, Err: err}
	}
	env.Payload = m
	return &env, nil
}
