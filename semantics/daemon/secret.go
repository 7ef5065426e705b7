package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// Secret is one secret for a leased attempt (§149–152).
type Secret struct {
	// ID names the secret (the SecretRef; not secret itself, it is logged).
	ID string
	// Bytes is the material. SendSecrets copies it into one frame buffer,
	// writes it and zeroes that buffer; it keeps no reference. The caller
	// owns Bytes and should zero it after SendSecrets returns.
	Bytes []byte
	// ExpiresAt: the agent discards (zeroes) the secret at this time if the
	// attempt has not consumed it. Zero means now + DefaultSecretTTL; it
	// is capped at the lease's expiry.
	ExpiresAt time.Time
}

// Secret delivery bounds.
const (
	// DefaultSecretTTL is the default lifetime of a delivered secret.
	DefaultSecretTTL = 5 * time.Minute
	// MaxSecretsPerStream bounds the secrets of one SendSecrets call.
	MaxSecretsPerStream = 16
)

// Errors of SendSecrets.
var (
	// ErrSecretLease: the lease is not an accepted, unexpired lease, so no
	// agent holds its attempt.
	ErrSecretLease = errors.New("daemon: secrets go only to an accepted, unexpired lease")
	// ErrSecretRefused: the agent refused the secret stream (it does not
	// hold the lease's attempt any more, or the material was invalid).
	ErrSecretRefused = errors.New("daemon: agent refused the secret stream")
)

// SendSecrets delivers secrets to the agent holding lease, on a dedicated
// stream of kind wire.StreamSecret (never on the control stream, §150):
// one envelope frame per SecretMaterialV1, then the daemon closes its
// side and the agent answers by closing its own (accepted and stored) or
// resetting the stream with StreamRefused (it does not hold the attempt,
// or a secret was invalid or already expired). The lease must be accepted
// and unexpired in the authority and its agent session connected to this
// daemon (ErrNotConnected otherwise). It returns nil once the agent
// acknowledged; ErrSecretLease, ErrSecretRefused, a validation error or
// ctx's error otherwise.
//
// Nothing here logs, records or keeps the material: the log records name
// the lease, the secret ids and the byte counts only, and the frame buffer
// is zeroed after the write. The transport's own buffers (TLS records,
// QUIC stream frames) are released, not zeroed.
func (d *Daemon) SendSecrets(ctx context.Context, lease wire.LeaseId, secrets ...Secret) error {
	if d.ctx.Err() != nil {
		return ErrShutdown
	}
	if len(secrets) == 0 || len(secrets) > MaxSecretsPerStream {
		return fmt.Errorf("daemon: SendSecrets takes 1 to %d secrets, got %d", MaxSecretsPerStream, len(secrets))
	}
	actx, cancel := context.WithTimeout(ctx, d.timing.RequestTimeout)
	l, err := d.auth.Lease(actx, lease)
	cancel()
	switch {
	case errors.Is(err, authority.ErrNotFound):
		return ErrSecretLease
	case err != nil:
		return err
	}
	now := d.now()
	l.ExpiresAt = d.toLocal(l.ExpiresAt) // the authority's clock (dbclock.go) to this daemon's
	if l.State != authority.LeaseAccepted || !l.ExpiresAt.After(now) {
		return ErrSecretLease
	}
	msgs := make([]agentwire.SecretMaterialV1, len(secrets))
	for i, s := range secrets {
		exp := s.ExpiresAt
		if exp.IsZero() {
			exp = now.Add(DefaultSecretTTL)
		}
		if exp.After(l.ExpiresAt) {
			exp = l.ExpiresAt
		}
		if !exp.After(now) {
			return fmt.Errorf("daemon: secret %q already expired", s.ID)
		}
		msgs[i] = agentwire.SecretMaterialV1{Lease: lease, SecretID: s.ID, Bytes: s.Bytes, ExpiresAtMs: uint64(exp.UnixMilli())}
		if err := msgs[i].Validate(); err != nil {
			return fmt.Errorf("daemon: secret %d: %w", i, err)
		}
	}
	c := d.sessionConn(l.Session)
	if c == nil || !c.active() {
		return ErrNotConnected
	}
	if _, _, _, role := c.ident(); role != agentwire.RoleAgent && role != agentwire.RoleInternalWorker {
		return ErrRoleForbidden
	}
	err = c.sendSecrets(ctx, msgs)
	log := c.logger().With("lease", lease.String(), "secrets", len(msgs))
	if err != nil {
		d.hard.secretsRefused.Add(1)
		log.Info("secret delivery failed", "err", err)
		return err
	}
	d.hard.secretsSent.Add(1)
	log.Debug("secrets delivered")
	return nil
}

func (c *conn) sendSecrets(ctx context.Context, msgs []agentwire.SecretMaterialV1) error {
	ctx, cancel := context.WithTimeout(ctx, c.d.timing.RequestTimeout)
	defer cancel()
	st, err := c.sc.OpenStream(ctx, wire.StreamSecret)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() {
		st.CancelWrite(semantics.StreamCancelled)
		st.CancelRead(semantics.StreamCancelled)
	})
	defer stop()
	c.mu.Lock()
	proto := c.negotiated
	c.mu.Unlock()
	var buf []byte
	defer func() { clear(buf[:cap(buf)]) }()
	for i := range msgs {
		env := &wire.Envelope{Protocol: proto, MessageID: wire.NewMessageId(), SentAtMs: uint64(c.d.now().UnixMilli()), Payload: &msgs[i]}
		clear(buf[:cap(buf)])
		buf, err = wire.AppendEnvelopeFrame(buf[:0], c.sc.Limits().MaxFrame[wire.StreamSecret], env)
		if err != nil {
			st.CancelWrite(semantics.StreamCancelled)
			st.CancelRead(semantics.StreamCancelled)
			return err
		}
		if _, err := st.Write(buf); err != nil {
			st.CancelRead(semantics.StreamCancelled)
			return secretStreamErr(ctx, err)
		}
	}
	if err := st.SendStream.Close(); err != nil {
		st.CancelRead(semantics.StreamCancelled)
		return secretStreamErr(ctx, err)
	}
	// The agent's answer: a clean end of its side, nothing else.
	b, err := st.ReadFrame()
	switch {
	case err == io.EOF:
		return nil
	case err == nil:
		_ = b
		st.CancelRead(semantics.StreamProtocolError)
		return fmt.Errorf("%w: unexpected frame on the secret stream", ErrSecretRefused)
	default:
		return secretStreamErr(ctx, err)
	}
}

func secretStreamErr(ctx context.Context, err error) error {
	var se *semantics.StreamError
	if errors.As(err, &se) && se.Remote && se.Code == semantics.StreamRefused {
		return ErrSecretRefused
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}
