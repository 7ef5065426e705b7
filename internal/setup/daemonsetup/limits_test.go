package daemonsetup

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/daemon"
)

const daemonBase = `
[tls]
certificate = "s.pem"
private_key = "k.pem"
client_ca = "ca.pem"
[authority]
sqlite = "a.db"
`

// TestDaemonLimits: [limits], [admission] and [data] convert to the
// daemon's one daemon.Limits; an empty file gives exactly the daemon's
// defaults (this package keeps no copy of them).
func TestDaemonLimits(t *testing.T) {
	d, err := config.ParseDaemon("d.toml", []byte(daemonBase+`
[data]
log_rate_bytes = 1048576
cas_max_per_conn = 8
[admission]
registration_rate = 50
[limits]
max_streams = 1000
certificate_rate_per_min = 2
`))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := Limits(d)
	if err != nil {
		t.Fatal(err)
	}
	l := lim.WithDefaults()
	if l.Conn.MaxStreams != 1000 || l.Conn.StreamCredit() != 1016 || l.Conn.IdentityRate != (semantics.Rate{PerSecond: 2.0 / 60, Burst: 4 * 2}) {
		t.Errorf("conn %+v", l.Conn)
	}
	if l.Admission.RegistrationRate != (semantics.Rate{PerSecond: 50, Burst: 100}) || l.Admission.MaxHandshakes != daemon.DefaultMaxHandshakes {
		t.Errorf("admission %+v", l.Admission)
	}
	if l.Data.LogRateBytes != 1<<20 || l.Data.CASMaxPerConn != 8 || l.Data.CASMaxConcurrent != daemon.DefaultLimits().Data.CASMaxConcurrent {
		t.Errorf("data %+v", l.Data)
	}
	e, err := config.ParseDaemon("d.toml", []byte(daemonBase))
	if err != nil {
		t.Fatal(err)
	}
	el, err := Limits(e)
	if err != nil {
		t.Fatal(err)
	}
	if got := el.WithDefaults(); got != daemon.DefaultLimits() {
		t.Errorf("empty sections: %+v, want daemon.DefaultLimits() %+v", got, daemon.DefaultLimits())
	}
}

// TestLimitErrors: an invalid limit value is refused by daemon.Limits'
// rules (the only copy) with a *config.Error naming its TOML key, the rule
// and the value as written; -1 is "none" where the daemon takes a negative
// value as none, and only -1.
func TestLimitErrors(t *testing.T) {
	for _, c := range []struct{ toml, key, msg string }{
		{"[limits]\nmax_streams = -3", "limits.max_streams", "must not be negative (0: the default); got -3"},
		{"[limits]\ncas_burst = -1", "limits.cas_burst", "must not be negative (0: the default); got -1"},
		{"[limits]\ncontrol_rate = nan", "limits.control_rate", "must be a number, not negative (0: the default); got NaN"},
		{"[limits]\ncertificate_rate_per_min = -0.5", "limits.certificate_rate_per_min", "must be a number, not negative (0: the default); got -0.5"},
		{"[admission]\nmax_handshakes = -5", "admission.max_handshakes", "must not be negative (0: the default); got -5"},
		{"[admission]\nregistration_burst = -1", "admission.registration_burst", "must not be negative (0: the default); got -1"},
		{"[admission]\nmax_conns_per_ip = -1", "admission.max_conns_per_ip", "must not be negative (0: off); got -1"},
		{"[admission]\nmax_connections = -2", "admission.max_connections", "must be ≥ 0, or -1 for none (0: the default); got -2"},
		{"[data]\nlog_rate_bytes = -1", "data.log_rate_bytes", "must be a number, not negative (0: unlimited); got -1"},
		{"[data]\nmax_attempt_log_bytes = -2", "data.max_attempt_log_bytes", "must be ≥ 0, or -1 for none (0: the default); got -2"},
		{"[data]\ncas_max_per_conn = -1", "data.cas_max_per_conn", "must not be negative (0: the default); got -1"},
	} {
		d, err := config.ParseDaemon("d.toml", []byte(daemonBase+c.toml))
		if err != nil {
			t.Errorf("%q: ParseDaemon: %v (limit keys are daemonsetup.Limits' to check)", c.toml, err)
			continue
		}
		_, err = Limits(d)
		var ce *config.Error
		if !errors.As(err, &ce) || ce.Key != c.key || ce.Msg != c.msg {
			t.Errorf("%q: %v, want a *config.Error %s: %s", c.toml, err, c.key, c.msg)
		}
		if !config.IsInvalid(err) {
			t.Errorf("%q: %v is not config.IsInvalid (a usage error)", c.toml, err)
		}
	}
	d, err := config.ParseDaemon("d.toml", []byte(daemonBase+"[admission]\nmax_connections = -1\n[data]\nmax_attempt_log_bytes = -1\n"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := Limits(d)
	if err != nil || l.Admission.MaxConnections != -1 || l.Data.MaxAttemptLogBytes != -1 {
		t.Errorf("-1 (none): %+v, %v", l, err)
	}
}

// TestLimitKeys checks the table limitKeys against the conversion: each
// TOML key of the daemon's configuration is set alone (every key of
// config.Daemon, found by its toml tags), and the field of daemon.Limits
// that changes (found by walking daemon.Limits) must be the table's entry
// for that key; every entry must be reached so, and a value of -2 at its
// key must be refused naming the key.
func TestLimitKeys(t *testing.T) {
	byField := map[string]string{}
	byKey := map[string]bool{}
	for _, k := range limitKeys {
		if _, dup := byField[k.field]; dup || byKey[k.key] {
			t.Errorf("limitKeys: %s → %s is a second entry of its field or key", k.field, k.key)
		}
		byField[k.field], byKey[k.key] = k.key, true
	}
	zero := fieldsOf(limits(&config.Daemon{}))
	reached := map[string]string{}
	for _, key := range config.Keys(reflect.TypeFor[config.Daemon]()) {
		var d config.Daemon
		v, _ := tomlValue(&d, key)
		if !setSample(v) {
			continue
		}
		var changed []string
		for path, got := range fieldsOf(limits(&d)) {
			if !reflect.DeepEqual(got, zero[path]) {
				changed = append(changed, path)
			}
		}
		slices.Sort(changed)
		switch {
		case len(changed) > 1:
			t.Errorf("%s sets %d fields of daemon.Limits (%v); limitKeys maps a field to one key", key, len(changed), changed)
		case len(changed) == 1 && byField[changed[0]] != key:
			t.Errorf("%s sets daemon.Limits.%s, whose limitKeys entry is %q: add or correct {field: %q, key: %q}", key, changed[0], byField[changed[0]], changed[0], key)
		case len(changed) == 1:
			reached[changed[0]] = key
		}
	}
	for _, k := range limitKeys {
		if reached[k.field] != k.key {
			t.Errorf("limitKeys entry %s → %s: no TOML key sets that field through the conversion (a stale entry, or a misspelt field or key)", k.field, k.key)
			continue
		}
		var d config.Daemon
		v, _ := tomlValue(&d, k.key)
		if v.CanInt() {
			v.SetInt(-2)
		} else {
			v.SetFloat(-2)
		}
		_, err := Limits(&d)
		var ce *config.Error
		if !errors.As(err, &ce) || ce.Key != k.key || !strings.HasSuffix(ce.Msg, "; got -2") {
			t.Errorf("%s = -2: %v, want an error naming %s and the value", k.key, err, k.key)
		}
	}
	if len(reached) < 20 {
		t.Errorf("only %d fields reached: the walk proves nothing", len(reached))
	}
}

// fieldsOf returns the leaf fields of l by their path from daemon.Limits
// (as semantics.InvalidLimitError.Field names them): every struct is walked,
// arrays, pointers and scalars are leaves.
func fieldsOf(l daemon.Limits) map[string]any {
	out := map[string]any{}
	var walk func(v reflect.Value, prefix string)
	walk = func(v reflect.Value, prefix string) {
		if v.Kind() != reflect.Struct {
			out[strings.TrimSuffix(prefix, ".")] = v.Interface()
			return
		}
		for i := range v.NumField() {
			walk(v.Field(i), prefix+v.Type().Field(i).Name+".")
		}
	}
	walk(reflect.ValueOf(l), "")
	return out
}

// setSample sets v to a non-zero value that passes every limit rule and
// reports whether it could.
func setSample(v reflect.Value) bool {
	switch {
	case v.CanInt():
		v.SetInt(7)
	case v.CanUint():
		v.SetUint(7)
	case v.CanFloat():
		v.SetFloat(7.5)
	case v.Kind() == reflect.String:
		v.SetString("x")
	case v.Kind() == reflect.Bool:
		v.SetBool(true)
	case v.Type() == reflect.TypeFor[config.Duration]():
		v.Set(reflect.ValueOf(config.Duration{Duration: 7 * time.Second}))
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.String:
		v.Set(reflect.ValueOf([]string{"x"}).Convert(v.Type()))
	default:
		return false
	}
	return true
}
