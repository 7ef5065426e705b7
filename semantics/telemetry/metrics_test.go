package telemetry_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
)

// wantMetrics is every metric the package exports, with its type.
var wantMetrics = map[string]dto.MetricType{
	"forgeyard_transport_connections_active":          dto.MetricType_GAUGE,
	"forgeyard_transport_connections_total":           dto.MetricType_COUNTER,
	"forgeyard_transport_reconnects_total":            dto.MetricType_COUNTER,
	"forgeyard_transport_tls_resumed_total":           dto.MetricType_COUNTER,
	"forgeyard_transport_handshake_duration_seconds":  dto.MetricType_HISTOGRAM,
	"forgeyard_transport_registration_failures_total": dto.MetricType_COUNTER,
	"forgeyard_transport_handshake_failures_total":    dto.MetricType_COUNTER,
	"forgeyard_transport_received_bytes_total":        dto.MetricType_COUNTER,
	"forgeyard_transport_sent_bytes_total":            dto.MetricType_COUNTER,
	"forgeyard_transport_streams_active":              dto.MetricType_GAUGE,
	"forgeyard_transport_control_queue_bytes":         dto.MetricType_GAUGE,
	"forgeyard_transport_log_queue_bytes":             dto.MetricType_GAUGE,
	"forgeyard_transport_cas_queue_bytes":             dto.MetricType_GAUGE,
	"forgeyard_transport_protocol_errors_total":       dto.MetricType_COUNTER,
	"forgeyard_transport_session_fenced_total":        dto.MetricType_COUNTER,
	"forgeyard_transport_messages_total":              dto.MetricType_COUNTER,
	"forgeyard_lease_offer_to_ack_seconds":            dto.MetricType_HISTOGRAM,
	"forgeyard_cancel_delivery_seconds":               dto.MetricType_HISTOGRAM,
	"forgeyard_heartbeat_rtt_seconds":                 dto.MetricType_HISTOGRAM,
	"forgeyard_completion_ack_seconds":                dto.MetricType_HISTOGRAM,
	"forgeyard_transport_fallback_events_total":       dto.MetricType_COUNTER,
	"forgeyard_log_bytes_total":                       dto.MetricType_COUNTER,
	"forgeyard_log_frames_total":                      dto.MetricType_COUNTER,
	"forgeyard_log_dropped_bytes_total":               dto.MetricType_COUNTER,
	"forgeyard_log_spool_bytes":                       dto.MetricType_GAUGE,
	"forgeyard_cas_bytes_total":                       dto.MetricType_COUNTER,
	"forgeyard_cas_objects_total":                     dto.MetricType_COUNTER,
	"forgeyard_data_store_errors_total":               dto.MetricType_COUNTER,
	"forgeyard_data_retention_deleted_bytes_total":    dto.MetricType_COUNTER,
	"forgeyard_data_retention_held_bytes":             dto.MetricType_GAUGE,
	"forgeyard_authority_up":                          dto.MetricType_GAUGE,
	"forgeyard_objstore_up":                           dto.MetricType_GAUGE,
	"forgeyard_cas_resumes_total":                     dto.MetricType_COUNTER,
	"forgeyard_cas_verification_failures_total":       dto.MetricType_COUNTER,
}

// allowedLabels are the only label names a series may carry (§208).
var allowedLabels = map[string]bool{"backend": true, "family": true, "outcome": true, "kind": true,
	"code": true, "reason": true, "from": true, "to": true, "le": true, "side": true, "direction": true,
	"store": true, "cause": true} // store: logs, cas, partial; cause: no_space, io_error

var ulidLike = regexp.MustCompile(`(?i)[0-9A-HJKMNP-TV-Z]{26}`)

func newID() string { return ulid.Make().String() }

// exercise calls every Metrics method, passing real identifiers wherever a
// string is accepted, and returns those identifiers.
func exercise(m *telemetry.Metrics) []string {
	runner, session, msg := newID(), newID(), newID()
	addr := "203.0.113.7:7443"
	m.ConnOpened("quic")
	m.ConnOpened("quic")
	m.ConnClosed("quic")
	m.ConnOpened("yamux")
	m.ConnOpened(runner) // careless: an id where a backend goes
	m.ConnOpened(addr)
	m.Reconnected("webtransport")
	m.Reconnected(session)
	m.TLSResumed("quic")
	m.TLSResumed(runner)
	m.ObserveHandshake("quic", 3*time.Millisecond)
	m.ObserveHandshake(msg, -time.Second)
	m.HandshakeFailed("quic", "unknown_authority")
	m.HandshakeFailed("yamux", runner) // careless: an id where a reason goes
	m.HandshakeFailed(addr, "timeout")
	m.RegistrationFailed(telemetry.RegFailVersion)
	m.RegistrationFailed(telemetry.RegistrationFailureOf(wire.ErrCodeRunnerDisabled))
	m.RegistrationFailed(telemetry.RegistrationFailure(200))
	m.BytesIn(wire.StreamControl, 100)
	m.BytesIn(wire.StreamLog, 4096)
	m.BytesOut(wire.StreamCasUpload, 1<<20)
	m.BytesOut(wire.StreamKind(99), 7)
	m.BytesIn(wire.StreamControl, -5)
	m.StreamOpened(wire.StreamLog)
	m.StreamOpened(wire.StreamLog)
	m.StreamClosed(wire.StreamLog)
	m.QueueAdd(telemetry.QueueControl, 3)
	m.QueueAdd(telemetry.QueueControl, -1)
	m.SetQueueDepth(telemetry.QueueLog, 12)
	m.SetQueueDepth(telemetry.QueueCas, 2)
	m.SetQueueDepth(telemetry.Queue(9), 2)
	m.ProtocolError(wire.ErrCodeMalformed)
	m.ProtocolError(wire.ProtocolErrorCode(999))
	m.SessionFenced()
	m.MessageHandled(wire.FamilyAgent, telemetry.OutcomeOK)
	m.MessageHandled(wire.FamilyAgent, telemetry.OutcomeOK)
	m.MessageHandled(wire.FamilyCas, telemetry.OutcomeError)
	m.MessageTypeHandled(wire.TypeID(wire.FamilyLogs, 3), telemetry.OutcomeDuplicate)
	m.MessageHandled(wire.Family(77), telemetry.Outcome(50))
	m.ObserveLeaseOfferToAck(2 * time.Millisecond)
	m.ObserveCancelDelivery(40 * time.Millisecond)
	m.ObserveHeartbeatRTT(time.Millisecond)
	m.ObserveCompletionAck(5 * time.Millisecond)
	m.Fallback("quic", "yamux")
	m.Fallback(addr, runner)
	m.LogAccepted(false, 2, 300)
	m.LogAccepted(true, 1, 200)
	m.LogAccepted(true, -1, -1)
	m.LogDropped(50)
	m.LogDropped(-3)
	m.LogSpoolAdd(300)
	m.LogSpoolAdd(-120)
	m.CasTransferred(true, 1000)
	m.CasTransferred(false, 10)
	m.CasTransferred(false, -10)
	m.CasVerified(true)
	m.CasResumed(false)
	m.CasVerificationFailed(true)
	m.AuthorityUp(true)
	m.ObjectStoreUp(false)
	return []string{runner, session, msg, addr, "203.0.113.7"}
}

func scrape(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("Content-Type %q", ct)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func parse(t *testing.T, text string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("scraped text does not parse: %v\n%s", err, text)
	}
	return fams
}

func TestMetricsScrapeNamesTypesAndLabels(t *testing.T) {
	m := telemetry.NewMetrics()
	ids := exercise(m)
	text := scrape(t, m.Handler())
	fams := parse(t, text)

	for name, typ := range wantMetrics {
		f, ok := fams[name]
		if !ok {
			t.Errorf("metric %s missing from the scrape", name)
			continue
		}
		if f.GetType() != typ {
			t.Errorf("metric %s has type %v, want %v", name, f.GetType(), typ)
		}
		if f.GetHelp() == "" {
			t.Errorf("metric %s has no help", name)
		}
	}
	for name := range fams {
		if _, ok := wantMetrics[name]; !ok {
			t.Errorf("unexpected metric %s (add it to wantMetrics and the docs)", name)
		}
	}

	for name, f := range fams {
		for _, s := range f.GetMetric() {
			for _, lp := range s.GetLabel() {
				if !allowedLabels[lp.GetName()] {
					t.Errorf("%s has label %q outside the low-cardinality set", name, lp.GetName())
				}
				v := lp.GetValue()
				if ulidLike.MatchString(v) {
					t.Errorf("%s{%s=%q} looks like a ULID", name, lp.GetName(), v)
				}
				for _, id := range ids {
					if strings.Contains(v, id) {
						t.Errorf("%s{%s=%q} carries the identifier/address %s", name, lp.GetName(), v, id)
					}
				}
			}
		}
	}
	// Whole-text check too: no fed identifier anywhere in the exposition.
	for _, id := range ids {
		if strings.Contains(text, id) {
			t.Errorf("scrape contains %s", id)
		}
	}
	if ulidLike.MatchString(text) {
		t.Errorf("scrape contains a ULID-like token: %s", ulidLike.FindString(text))
	}
}

// value returns the value of the series of fam whose labels include want.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("no metric %s", name)
	}
next:
	for _, s := range f.GetMetric() {
		got := map[string]string{}
		for _, lp := range s.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			return s.GetCounter().GetValue()
		case dto.MetricType_GAUGE:
			return s.GetGauge().GetValue()
		case dto.MetricType_HISTOGRAM:
			return float64(s.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("no series %s%v", name, want)
	return 0
}

func TestMetricsValues(t *testing.T) {
	m := telemetry.NewMetrics()
	exercise(m)
	fams := parse(t, scrape(t, m.Handler()))
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"forgeyard_transport_connections_active", map[string]string{"backend": "quic"}, 1},
		{"forgeyard_transport_connections_total", map[string]string{"backend": "quic"}, 2},
		{"forgeyard_transport_connections_active", map[string]string{"backend": "yamux"}, 1},
		{"forgeyard_transport_connections_total", map[string]string{"backend": "other"}, 2},
		{"forgeyard_transport_connections_total", map[string]string{"backend": "memory"}, 0},
		{"forgeyard_transport_reconnects_total", map[string]string{"backend": "webtransport"}, 1},
		{"forgeyard_transport_reconnects_total", map[string]string{"backend": "other"}, 1},
		{"forgeyard_transport_tls_resumed_total", map[string]string{"backend": "quic"}, 1},
		{"forgeyard_transport_tls_resumed_total", map[string]string{"backend": "other"}, 1},
		{"forgeyard_transport_handshake_duration_seconds", map[string]string{"backend": "quic"}, 1},
		{"forgeyard_transport_handshake_failures_total", map[string]string{"backend": "quic", "reason": "unknown_authority"}, 1},
		{"forgeyard_transport_handshake_failures_total", map[string]string{"backend": "yamux", "reason": "other"}, 1},
		{"forgeyard_transport_handshake_failures_total", map[string]string{"backend": "other", "reason": "timeout"}, 1},
		{"forgeyard_transport_handshake_failures_total", map[string]string{"backend": "webtransport", "reason": "certificate_expired"}, 0},
		{"forgeyard_transport_registration_failures_total", map[string]string{"reason": "version"}, 1},
		{"forgeyard_transport_registration_failures_total", map[string]string{"reason": "revoked"}, 1},
		{"forgeyard_transport_registration_failures_total", map[string]string{"reason": "other"}, 1},
		{"forgeyard_transport_received_bytes_total", map[string]string{"kind": "control"}, 100},
		{"forgeyard_transport_received_bytes_total", map[string]string{"kind": "log"}, 4096},
		{"forgeyard_transport_sent_bytes_total", map[string]string{"kind": "cas-upload"}, 1 << 20},
		{"forgeyard_transport_sent_bytes_total", map[string]string{"kind": "unknown"}, 7},
		{"forgeyard_transport_streams_active", map[string]string{"kind": "log"}, 1},
		{"forgeyard_transport_control_queue_bytes", nil, 2},
		{"forgeyard_transport_log_queue_bytes", nil, 12},
		{"forgeyard_transport_cas_queue_bytes", nil, 2},
		{"forgeyard_transport_protocol_errors_total", map[string]string{"code": "Malformed"}, 1},
		{"forgeyard_transport_protocol_errors_total", map[string]string{"code": "unknown"}, 1},
		{"forgeyard_transport_session_fenced_total", nil, 1},
		{"forgeyard_transport_messages_total", map[string]string{"family": "agent", "outcome": "ok"}, 2},
		{"forgeyard_transport_messages_total", map[string]string{"family": "cas", "outcome": "error"}, 1},
		{"forgeyard_transport_messages_total", map[string]string{"family": "logs", "outcome": "duplicate"}, 1},
		{"forgeyard_transport_messages_total", map[string]string{"family": "unknown", "outcome": "error"}, 1},
		{"forgeyard_lease_offer_to_ack_seconds", nil, 1},
		{"forgeyard_cancel_delivery_seconds", nil, 1},
		{"forgeyard_heartbeat_rtt_seconds", nil, 1},
		{"forgeyard_completion_ack_seconds", nil, 1},
		{"forgeyard_transport_fallback_events_total", map[string]string{"from": "quic", "to": "yamux"}, 1},
		{"forgeyard_transport_fallback_events_total", map[string]string{"from": "other", "to": "other"}, 1},
		{"forgeyard_log_bytes_total", map[string]string{"side": "agent"}, 300},
		{"forgeyard_log_bytes_total", map[string]string{"side": "daemon"}, 200},
		{"forgeyard_log_frames_total", map[string]string{"side": "agent"}, 2},
		{"forgeyard_log_frames_total", map[string]string{"side": "daemon"}, 1},
		{"forgeyard_log_dropped_bytes_total", nil, 50},
		{"forgeyard_log_spool_bytes", nil, 180},
		{"forgeyard_cas_bytes_total", map[string]string{"direction": "upload"}, 1000},
		{"forgeyard_cas_bytes_total", map[string]string{"direction": "download"}, 10},
		{"forgeyard_cas_objects_total", map[string]string{"direction": "upload"}, 1},
		{"forgeyard_cas_objects_total", map[string]string{"direction": "download"}, 0},
		{"forgeyard_cas_resumes_total", map[string]string{"direction": "download"}, 1},
		{"forgeyard_cas_verification_failures_total", map[string]string{"direction": "upload"}, 1},
	}
	for _, c := range checks {
		if got := value(t, fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// The cancel sample (40 ms) lands in the 50 ms bucket, not the 25 ms one.
	h := fams["forgeyard_cancel_delivery_seconds"].GetMetric()[0].GetHistogram()
	for _, b := range h.GetBucket() {
		want := uint64(0)
		if b.GetUpperBound() >= 0.05 {
			want = 1
		}
		if b.GetCumulativeCount() != want {
			t.Errorf("cancel_delivery bucket le=%v count %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), want)
		}
	}
	// Negative durations are observed as zero, not dropped or negative.
	if s := value(t, fams, "forgeyard_transport_handshake_duration_seconds", map[string]string{"backend": "other"}); s != 1 {
		t.Errorf("negative handshake sample count %v, want 1", s)
	}
}

func TestMetricsNilIsNoop(t *testing.T) {
	var m *telemetry.Metrics
	exercise(m) // must not panic
	if m.Registry() != nil {
		t.Fatal("nil Metrics has a registry")
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusNotFound {
		t.Fatalf("nil Metrics handler answered %d", rec.Code)
	}
}

func TestMetricsConcurrent(t *testing.T) {
	m := telemetry.NewMetrics()
	const workers, iters = 4, 500
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range iters {
				m.ConnOpened("quic")
				m.MessageHandled(wire.FamilyAgent, telemetry.OutcomeOK)
				m.BytesOut(wire.StreamControl, 10)
				m.ObserveHeartbeatRTT(time.Millisecond)
				m.ConnClosed("quic")
			}
		}()
	}
	wg.Wait()
	fams := parse(t, scrape(t, m.Handler()))
	if got := value(t, fams, "forgeyard_transport_connections_total", map[string]string{"backend": "quic"}); got != workers*iters {
		t.Errorf("connections_total %v, want %d", got, workers*iters)
	}
	if got := value(t, fams, "forgeyard_transport_connections_active", map[string]string{"backend": "quic"}); got != 0 {
		t.Errorf("connections_active %v, want 0", got)
	}
	if got := value(t, fams, "forgeyard_transport_sent_bytes_total", map[string]string{"kind": "control"}); got != 10*workers*iters {
		t.Errorf("bytes_out %v, want %d", got, 10*workers*iters)
	}
	if got := value(t, fams, "forgeyard_heartbeat_rtt_seconds", nil); got != workers*iters {
		t.Errorf("heartbeat samples %v, want %d", got, workers*iters)
	}
}

func TestRegistrationFailureOf(t *testing.T) {
	for code, want := range map[wire.ProtocolErrorCode]telemetry.RegistrationFailure{
		wire.ErrCodeUnsupportedVersion: telemetry.RegFailVersion,
		wire.ErrCodeForbidden:          telemetry.RegFailIdentity,
		wire.ErrCodeRunnerDisabled:     telemetry.RegFailRevoked,
		wire.ErrCodeDraining:           telemetry.RegFailOverloaded,
		wire.ErrCodeTimeout:            telemetry.RegFailTimeout,
		wire.ErrCodeMalformed:          telemetry.RegFailMalformed,
		wire.ErrCodeInternal:           telemetry.RegFailOther,
		wire.ProtocolErrorCode(4000):   telemetry.RegFailOther,
	} {
		if got := telemetry.RegistrationFailureOf(code); got != want {
			t.Errorf("RegistrationFailureOf(%v) = %v, want %v", code, got, want)
		}
	}
}
