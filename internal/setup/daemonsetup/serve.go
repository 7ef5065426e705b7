package daemonsetup

import (
	"context"
	"crypto/x509"
	"log/slog"
	"sync"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/telemetry/authmetrics"
	"forgeyard.dev/transport/wire"
)

// The daemon's start-up after Build, step by step: Instrument, Listen,
// StartAdmin, Serving.Accept, Serving.Wait. Each step that fails stops
// what it started; Serving.Close and Admin.Stop stop the rest.

// Instrument is the telemetry step: the engine feeds m and starts its spans
// on tracing (whose trace context travels to agents that offer it too,
// §211), every authority call's latency and error go to m (the store is
// the daemon's one shared dependency), and m watches the expiry of the
// certificate files read at start only. The host wraps dcfg.Hooks with its
// metrics before or after; tracing comes from otlpsetup (the OTLP
// exporters are the daemon binary's to link, not every importer's of this
// package).
func Instrument(cfg *config.Daemon, dcfg *daemon.Config, m *telemetry.Metrics, tracing *telemetry.Tracing) {
	dcfg.Metrics, dcfg.Tracing = m, tracing
	dcfg.Authority = authmetrics.Instrument(m, dcfg.Authority)
	watchFileOnce(m, "client_ca", cfg.TLS.ClientCA) // read at start only, like the pool
	watchFileOnce(m, "issuer", cfg.Enrollment.IssuerCertificate)
	dcfg.Features = dcfg.Features.With(wire.FeatureTraceContextV1)
}

// watchFileOnce exports the expiry of the first-expiring certificate of the
// PEM file at path as read now ("" or unreadable: nothing), for files the
// daemon reads at start only.
func watchFileOnce(m *telemetry.Metrics, role, path string) {
	if path == "" {
		return
	}
	if c := telemetry.CertificateFile(path)(); c != nil {
		m.WatchCertificate(role, func() *x509.Certificate { return c })
	}
}

// Serving is the daemon and its listeners, from Listen to Wait.
type Serving struct {
	Daemon    *daemon.Daemon
	Listeners []serversetup.Listener
	// HandshakeFailures reports the listeners' failed TLS handshakes
	// (rejected client certificates, scanners), which never reach the
	// daemon: to the metric, the health report and (certificate
	// problems, rate-limited) the audit log.
	HandshakeFailures *serversetup.HandshakeFailures

	log          *slog.Logger
	restartPeers map[string][]quic.RestartHint
	errc         chan error // one per accept loop's end
	conns        sync.WaitGroup
	cancelConns  context.CancelFunc
	waited       bool
}

// Listen is the daemon and listener step:
//
//  1. the QUIC listeners' stateless reset key, and from it the restart
//     token key: both survive restarts, so that the next process can tell
//     this one's agents it restarted (restart hints);
//  2. the daemon (daemon.New of dcfg);
//  3. the handshake-failure reporter, feeding m;
//  4. where the agents of a previous process that crashed were: read
//     before anything registers (registrations overwrite the rows), told
//     by Accept;
//  5. the listeners of cfg.Listen on b.TLS, their stream credit from the
//     daemon's per-connection limits.
//
// On an error, the daemon is shut down again.
func Listen(ctx context.Context, cfg *config.Daemon, b *Built, dcfg daemon.Config, m *telemetry.Metrics, log *slog.Logger) (*Serving, error) {
	resetKey, err := serversetup.ResetKey(cfg.Listen.StatelessResetKeyFile, cfg.TLS)
	if err != nil {
		return nil, err
	}
	dcfg.RestartTokenKey = serversetup.RestartTokenKey(resetKey)
	d, err := daemon.New(dcfg)
	if err != nil {
		return nil, err
	}
	s := &Serving{Daemon: d, HandshakeFailures: serversetup.NewHandshakeFailures(log, m, 0, 0), log: log}
	qcfg, ycfg := listenerConfigs(dcfg.AllLimits().Conn, log, s.HandshakeFailures.Report)
	qcfg.Admit = d.AdmitEarly            // the connection cap, before the QUIC handshake
	qcfg.Backlog = d.RegistrationBacklog // the way in bounded up to registration
	qcfg.StatelessResetKey = resetKey
	s.restartPeers, err = RestartPeers(ctx, authority.PeersOf(b.Authority), cfg.ID, dcfg.RestartTokenKey)
	if err != nil {
		log.Warn("restart hints skipped: the authority did not list the previous process's agents", "err", err)
	}
	if s.Listeners, err = serversetup.Listen(cfg.Listen, b.TLS, qcfg, ycfg); err != nil {
		_ = d.Shutdown(context.Background())
		s.HandshakeFailures.Close()
		return nil, err
	}
	return s, nil
}

// receiveBudget bounds the QUIC receive windows of all the daemon's
// connections beyond their initial 256 KiB (quic.Config.Budget): a window
// grows only on a long path (quic.Config.WindowRate) and only while the
// budget has room, so 10,000 agents cannot make the daemon buffer 16 MiB
// each. 256 MiB is 200 connections at a 50 ms path's 1.25 MiB at once.
const receiveBudget = 256 << 20

// listenerConfigs returns the QUIC (and WebTransport) and yamux
// configurations of the daemon's listeners: their stream credit derives
// from the daemon's per-connection limits lim ([limits]), their failed
// handshakes go to hsf, their window growth shares one receiveBudget.
func listenerConfigs(lim semantics.Limits, log *slog.Logger, hsf func(semantics.HandshakeFailure)) (quic.Config, yamux.Config) {
	return quic.Config{Logger: log, OnHandshakeFailure: hsf, Limits: lim, Budget: quic.NewMemoryBudget(receiveBudget)},
		yamux.Config{OnHandshakeFailure: hsf, Limits: lim}
}

// Accept is the accepting step: one accept loop per listener, each
// connection served by the daemon until Wait, each loop's end passed to
// done (listener i, its error); then the restart hints to the previous
// process's agents.
//
// Connections live on a context of their own, which ends only after Wait
// has shut the daemon down: daemon.Serve ties its connections to its own
// lifetime, so closing a listener there would drop agents before they get
// the drain hint. Hence this accept loop around ServeConn. track, when not
// nil, is told of each connection and called back at its end.
func (s *Serving) Accept(track func(semantics.BackendConn) func(), done func(i int, err error)) {
	connCtx, cancelConns := context.WithCancel(context.Background())
	s.cancelConns = cancelConns
	s.errc = make(chan error, len(s.Listeners))
	for i, l := range s.Listeners {
		s.log.Info("listening", "backend", l.Backend, "addr", l.Addr().String())
		go func() {
			err := s.acceptLoop(connCtx, l, track)
			done(i, err)
			s.errc <- err
		}()
	}
	if len(s.restartPeers) > 0 {
		go serversetup.HintRestart(connCtx, s.log, s.restartPeers, s.Listeners, 0)
	}
}

// acceptLoop accepts connections until l is closed and serves each on
// ctx.
func (s *Serving) acceptLoop(ctx context.Context, l semantics.BackendListener, track func(semantics.BackendConn) func()) error {
	for {
		bc, err := l.Accept(ctx)
		if err != nil {
			return err
		}
		s.conns.Add(1)
		go func() {
			defer s.conns.Done()
			if track != nil {
				defer track(bc)()
			}
			s.Daemon.ServeConn(ctx, bc)
		}()
	}
}

// Wait is the wait and shutdown step: until ctx ends or a listener fails
// (its error returned), then the drain: draining called (the host's
// health reports it; its scheduler stops), the listeners closed, the
// daemon's Shutdown within timeout (GoAway with the reconnect hint), the
// connections' end and the final stats.
func (s *Serving) Wait(ctx context.Context, timeout time.Duration, draining func()) error {
	s.waited = true
	var failed error
	select {
	case <-ctx.Done():
		s.log.Info("shutting down", "timeout", timeout)
	case failed = <-s.errc:
		s.log.Error("listener failed; shutting down", "err", failed)
	}
	draining()
	for _, l := range s.Listeners { // stop accepting first
		_ = l.Close()
	}
	for range len(s.Listeners) - boolInt(failed != nil) {
		<-s.errc
	}
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := s.Daemon.Shutdown(sctx); err != nil {
		s.log.Warn("agents still connected at shutdown timeout; closed", "err", err)
	}
	s.cancelConns()
	s.conns.Wait()
	st := s.Daemon.Stats()
	s.log.Info("daemon stopped", "registrations", st.Registrations, "leases_offered", st.LeasesOffered,
		"leases_accepted", st.LeasesAccepted, "completions_accepted", st.Completions[0])
	return failed
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Close stops what Listen started: when a later step failed before Wait,
// the listeners and the daemon (at once, without a drain); always the
// handshake-failure reporter.
func (s *Serving) Close() {
	if !s.waited {
		for _, l := range s.Listeners {
			_ = l.Close()
		}
		_ = s.Daemon.Shutdown(context.Background())
	}
	s.HandshakeFailures.Close()
}
