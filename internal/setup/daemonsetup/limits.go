package daemonsetup

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/daemon"
)

// Limits converts the [limits], [admission] and [data] sections to the
// daemon's one limits type, daemon.Limits (its doc lists every limit, its
// default and what enforces it), and validates it. Zero keys stay zero, so
// the daemon's defaults apply: neither package keeps a copy of them. Give
// Conn to the backends' Config too (their stream credit derives from it).
//
// daemon.Limits.Validate holds the only copy of the rules (internal/config
// checks none of these keys); its *semantics.InvalidLimitError becomes a
// *config.Error naming the TOML key of the field (limitKeys), the rule and
// the value as written, e.g. "limits.max_streams: must not be negative
// (0: the default); got -3". The one rule of the TOML's own is its spelling
// of "none": -1 where the daemon takes any negative value
// (admission.max_connections, data.max_attempt_log_bytes).
//
// The conversion lives here, not in internal/config, so that the agent and
// the relay, which read their configuration with internal/config, do not
// link the daemon engine.
func Limits(d *config.Daemon) (daemon.Limits, error) {
	l := limits(d)
	if err := l.Validate(); err != nil {
		return l, limitError(d, err)
	}
	for _, k := range limitKeys {
		if !k.none {
			continue
		}
		if v, ok := tomlValue(d, k.key); ok && v.CanInt() && v.Int() < -1 {
			return l, &config.Error{Key: k.key, Msg: fmt.Sprintf("must be ≥ 0, or -1 for none (0: the default); got %d", v.Int())}
		}
	}
	return l, nil
}

// limitKeys is the one table from a field of daemon.Limits that the TOML
// sets, by its path from daemon.Limits (semantics.InvalidLimitError.Field),
// to the dotted TOML key that sets it. TestLimitKeys checks it against the
// conversion (limits): every field a key sets has its entry, and every
// entry is a field that its key sets.
var limitKeys = []struct {
	field, key string
	// none: the field's negative values mean none (no cap); the TOML
	// spells it -1 and refuses other negative values.
	none bool
}{
	{field: "Conn.MaxStreams", key: "limits.max_streams"},
	{field: "Conn.ControlRate.PerSecond", key: "limits.control_rate"},
	{field: "Conn.ControlRate.Burst", key: "limits.control_burst"},
	{field: "Conn.HeartbeatRate.PerSecond", key: "limits.heartbeat_rate"},
	{field: "Conn.HeartbeatRate.Burst", key: "limits.heartbeat_burst"},
	{field: "Conn.HealthRate.PerSecond", key: "limits.health_rate"},
	{field: "Conn.HealthRate.Burst", key: "limits.health_burst"},
	{field: "Conn.CasRate.PerSecond", key: "limits.cas_rate"},
	{field: "Conn.CasRate.Burst", key: "limits.cas_burst"},
	{field: "Conn.IdentityRate.PerSecond", key: "limits.certificate_rate_per_min"}, // per minute in the TOML
	{field: "Conn.IdentityRate.Burst", key: "limits.certificate_burst"},
	{field: "Conn.MaxRateStrikes", key: "limits.max_rate_strikes"},
	{field: "Admission.MaxHandshakes", key: "admission.max_handshakes"},
	{field: "Admission.RegistrationRate.PerSecond", key: "admission.registration_rate"},
	{field: "Admission.RegistrationRate.Burst", key: "admission.registration_burst"},
	{field: "Admission.MaxConnsPerIP", key: "admission.max_conns_per_ip"},
	{field: "Admission.MaxConnections", key: "admission.max_connections", none: true},
	{field: "Admission.FDHeadroom", key: "admission.fd_headroom"},
	{field: "Data.LogRateBytes", key: "data.log_rate_bytes"},
	{field: "Data.LogBurstBytes", key: "data.log_burst_bytes"},
	{field: "Data.MaxAttemptLogBytes", key: "data.max_attempt_log_bytes", none: true},
	{field: "Data.CASMaxConcurrent", key: "data.cas_max_concurrent"},
	{field: "Data.CASMaxPerConn", key: "data.cas_max_per_conn"},
}

// limitError turns err of daemon.Limits.Validate into a *config.Error
// naming the TOML key of its field and the value as d holds it (the TOML's
// unit: certificate_rate_per_min is per minute). An error of a field
// without a key (none that the TOML sets can fail) keeps its Go path, under
// the key "limits".
func limitError(d *config.Daemon, err error) error {
	var le *semantics.InvalidLimitError
	if errors.As(err, &le) {
		for _, k := range limitKeys {
			if k.field != le.Field {
				continue
			}
			v := le.Value
			if tv, ok := tomlValue(d, k.key); ok {
				v = tv.Interface()
			}
			return &config.Error{Key: k.key, Msg: fmt.Sprintf("%s; got %v", le.Rule, v)}
		}
	}
	return &config.Error{Key: "limits", Msg: err.Error()}
}

// tomlValue is the field of d whose dotted TOML key is key (its toml tags).
func tomlValue(d *config.Daemon, key string) (reflect.Value, bool) {
	v := reflect.ValueOf(d).Elem()
	for name := range strings.SplitSeq(key, ".") {
		if v.Kind() != reflect.Struct {
			return reflect.Value{}, false
		}
		var found bool
		for i := range v.NumField() {
			if tag, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("toml"), ","); tag == name {
				v, found = v.Field(i), true
				break
			}
		}
		if !found {
			return reflect.Value{}, false
		}
	}
	return v, true
}

// limits converts [limits], [admission] and [data] without validating.
func limits(d *config.Daemon) daemon.Limits {
	return daemon.Limits{Conn: d.Limits.SemanticsLimits(), Admission: admission(d.Admission), Data: data(d.Data)}
}

// data converts the limits of [data] (not the directories).
func data(d config.Data) daemon.DataLimits {
	return daemon.DataLimits{LogRateBytes: d.LogRateBytes, LogBurstBytes: d.LogBurstBytes,
		MaxAttemptLogBytes: d.MaxAttemptLogBytes, CASMaxConcurrent: d.CASMaxConcurrent, CASMaxPerConn: d.CASMaxPerConn}
}

// admission converts [admission].
func admission(a config.Admission) daemon.Admission {
	return daemon.Admission{MaxHandshakes: a.MaxHandshakes, MaxConnsPerIP: a.MaxConnsPerIP,
		RegistrationRate: semantics.Rate{PerSecond: a.RegistrationRate, Burst: a.RegistrationBurst},
		MaxConnections:   a.MaxConnections, FDHeadroom: a.FDHeadroom}
}
