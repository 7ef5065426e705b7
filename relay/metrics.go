package relay

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the relay's Prometheus collectors (prefix forgeyard_relay_,
// low-cardinality labels only: backend ∈ {yamux, webtransport, ...},
// direction, opener, what).
type metrics struct {
	conns        *prometheus.CounterVec // backend
	active       *prometheus.GaugeVec   // backend
	refused      *prometheus.CounterVec // backend, what=connection|stream
	dialFailures prometheus.Counter
	streams      *prometheus.CounterVec // backend, opener=agent|daemon
	bytes        *prometheus.CounterVec // backend, direction=to_daemon|to_agent
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forgeyard_relay_connections_total",
			Help: "Agent connections accepted by the relay, by agent-side backend."}, []string{"backend"}),
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "forgeyard_relay_connections_active",
			Help: "Agent connections currently relayed, by agent-side backend."}, []string{"backend"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forgeyard_relay_refusals_total",
			Help: "Refusals: what=connection (total limit, closed with CloseOverloaded) or what=stream (per-connection stream limit, reset with StreamRefused)."},
			[]string{"backend", "what"}),
		dialFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "forgeyard_relay_upstream_dial_failures_total",
			Help: "Failed dial attempts to a daemon endpoint (each endpoint tried counts once)."}),
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forgeyard_relay_streams_total",
			Help: "Streams copied through the relay, by agent-side backend and opener (agent or daemon)."}, []string{"backend", "opener"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forgeyard_relay_bytes_total",
			Help: "Stream bytes copied through the relay, by agent-side backend and direction (to_daemon, to_agent)."}, []string{"backend", "direction"}),
	}
	// The refusal series exist at zero from the start (alerts and
	// dashboards can rate() them before the first refusal).
	for _, b := range []string{"yamux", "webtransport"} {
		for _, what := range []string{"connection", "stream"} {
			m.refused.WithLabelValues(b, what)
		}
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.conns, m.active, m.refused, m.dialFailures, m.streams, m.bytes} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, errors.Join(errors.New("relay: registering metrics"), err)
	}
	return m, nil
}
