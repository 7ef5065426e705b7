package daemonsetup

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"

	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
)

// Built is what Build assembled from a daemon's configuration: the server
// TLS (its certificate reloaded from its files), the authority, and the
// daemon.Config with its limits, timing, identity and stores. The host
// adds its hooks and telemetry to Config, calls daemon.New, opens the
// listeners on TLS and serves; Close, after the daemon's shutdown, stops
// what Build started (session-ticket refresh, certificate reload) and
// closes the authority.
type Built struct {
	TLS       *tls.Config
	Certs     *serversetup.CertReloader
	Authority authority.Authority
	Config    daemon.Config
	closers   []func()
}

// Close stops what Build started, in reverse order.
func (b *Built) Close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
	b.closers = nil
}

// Build is the daemon's start-up from cfg (validated: config.LoadDaemon),
// in the order the steps depend on each other:
//
//  1. server TLS: the certificate served from its files, reloaded when
//     they are replaced (tls.reload_interval) or on SIGHUP;
//  2. the runner CA pool (tls.client_ca) and the enrollment identity
//     ([enrollment], which may relax the TLS client authentication);
//  3. the authority (SQLite or PostgreSQL; a PostgreSQL still starting is
//     waited for);
//  4. TLS session tickets under keys kept in the authority (shared by HA
//     daemons, rotated, surviving restarts), installed on TLS before any
//     listener clones it;
//  5. the daemon.Config: timing, limits ([limits], [admission], [data]:
//     Limits), retention and the stores (the S3 data plane or local
//     directories).
//
// On an error, what the earlier steps started is stopped again.
func Build(ctx context.Context, cfg *config.Daemon, log *slog.Logger) (_ *Built, err error) {
	b := &Built{}
	defer func() {
		if err != nil {
			b.Close()
		}
	}()
	tlsConf, certs, stopReload, err := serversetup.ReloadingServerTLS(cfg.TLS, log)
	if err != nil {
		return nil, err
	}
	b.TLS, b.Certs, b.closers = tlsConf, certs, append(b.closers, stopReload)
	runnerCAs, err := RunnerCAs(cfg.TLS.ClientCA)
	if err != nil {
		return nil, err
	}
	identity, err := Identity(cfg.Enrollment, tlsConf)
	if err != nil {
		return nil, err
	}
	au, err := OpenAuthorityWaiting(ctx, cfg.Authority, log)
	if err != nil {
		return nil, err
	}
	b.Authority, b.closers = au, append(b.closers, func() { _ = au.Close() })
	stopTickets, err := startSessionTickets(ctx, cfg, au, tlsConf, log)
	if err != nil {
		return nil, err
	}
	b.closers = append(b.closers, stopTickets)
	if b.Config, err = daemonConfig(ctx, cfg, au, log); err != nil {
		return nil, err
	}
	b.Config.RunnerCAs, b.Config.Identity = runnerCAs, identity
	return b, nil
}

// startSessionTickets is Build's session-ticket step; refreshed every
// rotation period / 4 until stop.
func startSessionTickets(ctx context.Context, cfg *config.Daemon, au authority.Authority, tlsConf *tls.Config, log *slog.Logger) (stop func(), err error) {
	ks := authority.TicketKeysOf(au)
	if ks == nil || cfg.TLS.DisableSessionTickets {
		return func() {}, nil
	}
	tickets, err := serversetup.NewSessionTickets(ctx, ks.TicketKeys, cfg.TLS.SessionTicketRotation.Duration, log)
	if err != nil {
		return nil, err
	}
	tickets.Install(tlsConf)
	tctx, stopTickets := context.WithCancel(context.Background())
	tdone := make(chan struct{})
	go func() { defer close(tdone); tickets.Run(tctx) }()
	return func() { stopTickets(); <-tdone }, nil
}

// daemonConfig is Build's configuration step: the daemon's timing,
// limits, retention and its stores (the S3 data plane or local
// directories).
func daemonConfig(ctx context.Context, cfg *config.Daemon, au authority.Authority, log *slog.Logger) (daemon.Config, error) {
	t := cfg.Timing
	dcfg := daemon.Config{
		ID: cfg.ID, Authority: au, Protocol: cfg.Protocol(), MinProtocol: cfg.ProtocolMin.ProtocolVersion,
		Timing: daemon.Timing{
			HeartbeatInterval: t.HeartbeatInterval.Duration, RenewInterval: t.RenewInterval.Duration,
			LeaseTTL: t.LeaseTTL.Duration, RevokeGrace: t.RevokeGrace.Duration, MaxBackoff: t.MaxBackoff.Duration,
			MaxHeartbeatsPerSecond: t.MaxHeartbeatsPerSecond, MaxHeartbeatInterval: t.MaxHeartbeatInterval.Duration,
			HeartbeatGrace: t.HeartbeatGrace.Duration,
		},
		OpenFiles:          OpenFiles(),
		AlternateEndpoints: cfg.Alternates(),
		LogDir:             cfg.Data.LogDir,
		Logger:             log,
		Features:           wire.Implemented,
	}
	lim, err := Limits(cfg) // [limits], [admission], [data]
	if err != nil {
		return dcfg, err
	}
	dcfg.Bounds = lim
	r := cfg.Data.Retention // [data.retention]
	dcfg.Retention = daemon.Retention{MaxAge: r.MaxAge.Duration, MaxBytes: r.MaxBytes, Interval: r.Interval.Duration,
		PartialMaxAge: r.PartialMaxAge.Duration}
	if cfg.Data.Store == config.StoreS3 {
		// The shared data plane: logs and objects in the bucket every HA
		// daemon sees (docs/operations.md "HA deployment").
		ds, err := OpenData(ctx, cfg.Data)
		if err != nil {
			return dcfg, err
		}
		dcfg.LogSink, dcfg.ContentStore = ds.Sink, ds.Store
		log.Info("data plane on S3", "endpoint", cfg.Data.S3.Endpoint, "bucket", cfg.Data.S3.Bucket, "prefix", cfg.Data.S3.Prefix)
	} else if dir := cfg.Data.CASDir; dir != "" {
		store, err := cas.NewFSStore(cas.FSStoreConfig{Dir: dir})
		if err != nil {
			return dcfg, fmt.Errorf("data.cas_dir: %w", err)
		}
		dcfg.ContentStore = store
		log.Info("content store: a local directory (data.cas_dir; by default beside --dev-pki or the SQLite authority)", "dir", dir)
	}
	if cfg.Data.Store != config.StoreS3 && cfg.Data.LogDir != "" {
		log.Info("log store: a local directory (data.log_dir; by default beside --dev-pki or the SQLite authority)", "dir", cfg.Data.LogDir)
	}
	return dcfg, nil
}
