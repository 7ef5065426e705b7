package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/session"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/signing"
)

// ErrNoSigningWorker: no active signing worker on this daemon advertises
// the request's key (or Runner, when set, is not connected as one).
var ErrNoSigningWorker = errors.New("daemon: no connected signing worker holds that key")

// SignRequest asks a signing worker for a signature (§99): the fields of
// signing.SignRequestV1, and optionally the worker.
type SignRequest struct {
	// Runner, when set, is the signing worker to ask; zero picks the
	// newest connected signing worker that advertises KeyRef
	// (session.SigningKeyLabel in its registration capabilities).
	Runner       wire.RunnerId
	KeyRef       string
	Algorithm    signing.SignatureAlgorithm
	Subject      wire.Digest
	MaterialRefs []wire.CasObjectRef
	// Policy is the proof that authorizes the request; the worker checks
	// it against its own policy.
	Policy signing.PolicyProofV1
}

// SignResult is a signature made by a signing worker.
type SignResult struct {
	Runner    wire.RunnerId // the worker that signed
	Signature []byte
	Chain     [][]byte // DER certificates of the key, leaf first, when the worker has them
}

// SignRefusedError is a sign request the worker refused. Code is the
// stable refusal code the reason starts with (semantics/signer's
// RefusalCode values, e.g. "unknown-policy"); Reason is the worker's
// whole text.
type SignRefusedError struct {
	Runner wire.RunnerId
	Code   string
	Reason string
}

// Error names the worker and the reason.
func (e *SignRefusedError) Error() string {
	return fmt.Sprintf("daemon: signing worker %s refused: %s", e.Runner, e.Reason)
}

// Sign sends the request to a connected signing worker that holds the key
// and waits for its answer until ctx ends (without a deadline, for the
// request timeout, Timing.RequestTimeout). It returns the signature, a
// *SignRefusedError, ErrNoSigningWorker, a *wire.WireErrorV1 when the
// worker answered with a protocol error, or ctx's error. The request is
// validated first (an invalid one is never sent). The worker checks the
// policy proof; the caller verifies the signature with the key's public
// key.
func (d *Daemon) Sign(ctx context.Context, req SignRequest) (SignResult, error) {
	m := &signing.SignRequestV1{KeyRef: req.KeyRef, Algorithm: req.Algorithm, Subject: req.Subject,
		MaterialRefs: req.MaterialRefs, Policy: req.Policy}
	if err := m.Validate(); err != nil {
		return SignResult{}, fmt.Errorf("daemon: invalid sign request: %w", err)
	}
	if d.ctx.Err() != nil {
		return SignResult{}, ErrShutdown
	}
	var c *conn
	for _, p := range d.peerConns(agentwire.RoleSigningWorker, req.Runner) {
		if req.Runner != (wire.RunnerId{}) || session.AdvertisesKey(d.peers.labelsOf(p.transport), req.KeyRef) {
			c = p
			break
		}
	}
	if c == nil {
		return SignResult{}, ErrNoSigningWorker
	}
	runner, _, _, _ := c.ident()
	env, err := c.call(ctx, m)
	if err != nil {
		return SignResult{}, err
	}
	resp, ok := env.Payload.(*signing.SignResponseV1)
	if !ok {
		return SignResult{}, fmt.Errorf("daemon: signing worker %s answered %s", runner, nameOf(env.Payload.MessageType()))
	}
	o := &resp.Outcome
	if o.Kind == signing.SignRejected {
		code, _, _ := strings.Cut(o.Reason, ":")
		return SignResult{}, &SignRefusedError{Runner: runner, Code: code, Reason: o.Reason}
	}
	return SignResult{Runner: runner, Signature: o.Signature, Chain: o.Chain}, nil
}

// call sends m to the peer on c and waits for the correlated answer until
// ctx ends (without a deadline: the request timeout). A WireErrorV1 answer
// is returned as the error.
func (c *conn) call(ctx context.Context, m wire.Message) (*wire.Envelope, error) {
	ch := c.channel()
	if ch == nil {
		return nil, ErrNotConnected
	}
	timeout := c.d.timing.RequestTimeout
	if dl, ok := ctx.Deadline(); ok {
		// ctx decides: the channel's own timer only backs it up.
		timeout = max(time.Until(dl), 0) + time.Second
	}
	o := control.Out{Msg: m}
	if c.traced() {
		o.Trace, o.HasTrace = telemetry.Inject(ctx)
	}
	env, err := ch.Call(ctx, o, timeout)
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	var we *wire.WireErrorV1
	if errors.As(err, &we) {
		return nil, we
	}
	return env, err
}
