package signer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/session"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/signing"
)

// Config configures a Worker. New copies it.
type Config struct {
	// Keys are the keys the worker signs with; refs must be unique.
	Keys []Key
	// Policy decides which requests are signed.
	Policy Policy
	// Now is the clock proofs are judged by; nil → time.Now.
	Now func() time.Time
	// Logger receives one line per decision (key ref, policy id, outcome;
	// never the attestation or the signature). Nil discards.
	Logger *slog.Logger
	// OnDecision, when set, is called after every request is decided;
	// code is "" for a signature.
	OnDecision func(req *signing.SignRequestV1, code RefusalCode)
}

// Worker answers sign requests; it is the agent.Service of a signing
// worker. Methods are safe for concurrent use.
type Worker struct {
	cfg             Config
	keys            map[string]Key
	log             *slog.Logger
	signed, refused atomic.Int64
	byCode          map[RefusalCode]*atomic.Int64
	_               struct{}
}

var _ agent.Service = (*Worker)(nil)

// New checks cfg and returns a Worker.
func New(cfg Config) (*Worker, error) {
	if len(cfg.Keys) == 0 {
		return nil, errors.New("signer: Config.Keys is empty")
	}
	w := &Worker{cfg: cfg, keys: map[string]Key{}, log: cfg.Logger, byCode: map[RefusalCode]*atomic.Int64{}}
	for code := range refusalText {
		w.byCode[code] = new(atomic.Int64)
	}
	for i, k := range cfg.Keys {
		if !ValidKeyRef(k.Ref) || k.signer == nil {
			return nil, fmt.Errorf("signer: Config.Keys[%d] is not a loaded key (use LoadKeyFile, GenerateKeyFile or NewKey)", i)
		}
		if _, dup := w.keys[k.Ref]; dup {
			return nil, fmt.Errorf("signer: Config.Keys[%d]: key ref %q repeated", i, k.Ref)
		}
		w.keys[k.Ref] = k
	}
	if w.cfg.Now == nil {
		w.cfg.Now = time.Now
	}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	return w, nil
}

// Labels returns the capability labels advertising the worker's keys, for
// agent.Config.Capabilities.Labels.
func (w *Worker) Labels() []string {
	var out []string
	for ref := range w.keys {
		out = append(out, session.SigningKeyLabel(ref))
	}
	slices.Sort(out)
	return out
}

// Serve implements agent.Service: a SignRequestV1 is answered with a
// SignResponseV1. The agent endpoint passes only the signing family;
// anything else is answered InvalidState.
func (w *Worker) Serve(_ context.Context, req agent.ServiceRequest) wire.Message {
	m, ok := req.Msg.(*signing.SignRequestV1)
	if !ok {
		return &wire.WireErrorV1{Code: wire.ErrCodeInvalidState, Retry: wire.RetryNever, Message: "a signing worker answers sign requests only"}
	}
	r := w.Sign(m)
	return &r
}

// Sign decides one request: the signature, or a refusal with its stable
// code.
func (w *Worker) Sign(req *signing.SignRequestV1) signing.SignResponseV1 {
	key, ok := w.keys[req.KeyRef]
	code := w.cfg.Policy.check(req, key, ok, w.cfg.Now())
	var out signing.SignResponseV1
	if code == "" {
		sig, err := key.sign(req.Subject[:])
		if err != nil {
			code = RefuseInternal
		} else {
			out.Outcome = signing.SignOutcomeV1{Kind: signing.SignSigned, Signature: sig}
		}
	}
	if code != "" {
		out.Outcome = signing.SignOutcomeV1{Kind: signing.SignRejected, Reason: code.Reason()}
		w.refused.Add(1)
		w.byCode[code].Add(1)
		w.log.Info("sign request refused", "key_ref", req.KeyRef, "policy", req.Policy.PolicyID, "code", string(code))
	} else {
		w.signed.Add(1)
		w.log.Info("sign request signed", "key_ref", req.KeyRef, "policy", req.Policy.PolicyID, "algorithm", req.Algorithm.String())
	}
	if f := w.cfg.OnDecision; f != nil {
		f(req, code)
	}
	return out
}

// Stats are a Worker's counters.
type Stats struct {
	Signed  int64
	Refused int64
	ByCode  map[RefusalCode]int64 // refusals by code
}

// Stats returns a snapshot of the counters.
func (w *Worker) Stats() Stats {
	s := Stats{Signed: w.signed.Load(), Refused: w.refused.Load(), ByCode: map[RefusalCode]int64{}}
	for c, n := range w.byCode {
		if v := n.Load(); v > 0 {
			s.ByCode[c] = v
		}
	}
	return s
}

// AgentConfig returns base set up as this worker's endpoint: the signing
// role, the worker as its Service, its key labels added to the
// capabilities and FeatureSigningV1 offered.
func (w *Worker) AgentConfig(base agent.Config) agent.Config {
	base.Role = agentwire.RoleSigningWorker
	base.Service = w
	base.Executor = nil
	base.Capabilities.Labels = append(slices.Clone(base.Capabilities.Labels), w.Labels()...)
	base.Features = base.Features.With(wire.FeatureSigningV1)
	return base
}
