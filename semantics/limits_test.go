package semantics_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// TestLimitsValidateFields: Limits.Validate and Rate.Validate report the
// field that breaks its rule as an *InvalidLimitError naming the field's Go
// path, its value and the rule (the configuration layers map Field to their
// own keys), and accept the zero value and the defaults.
func TestLimitsValidateFields(t *testing.T) {
	for _, l := range []semantics.Limits{{}, semantics.DefaultLimits()} {
		if err := l.Validate(); err != nil {
			t.Errorf("Validate(%+v): %v", l, err)
		}
	}
	var bigFrame semantics.Limits
	bigFrame.MaxFrame[wire.StreamLog] = wire.MaxAnyFrame + 1
	var perKind semantics.Limits
	perKind.MaxStreamsPerKind[wire.StreamCasUpload] = -2
	for _, c := range []struct {
		l     semantics.Limits
		field string
		value any
	}{
		{semantics.Limits{MaxStreams: -1}, "MaxStreams", -1},
		{perKind, "MaxStreamsPerKind[" + wire.StreamCasUpload.String() + "]", -2},
		{bigFrame, "MaxFrame[" + wire.StreamLog.String() + "]", wire.MaxAnyFrame + 1},
		{semantics.Limits{LogQueue: -3}, "LogQueue", -3},
		{semantics.Limits{MaxRefusals: -1}, "MaxRefusals", -1},
		{semantics.Limits{HeaderTimeout: -time.Second}, "HeaderTimeout", -time.Second},
		{semantics.Limits{BulkChunk: -1}, "BulkChunk", -1},
		{semantics.Limits{ControlRate: semantics.Rate{PerSecond: -1}}, "ControlRate.PerSecond", -1.0},
		{semantics.Limits{IdentityRate: semantics.Rate{Burst: -4}}, "IdentityRate.Burst", -4},
		{semantics.Limits{MaxRateStrikes: -1}, "MaxRateStrikes", -1},
	} {
		err := c.l.Validate()
		var le *semantics.InvalidLimitError
		if !errors.As(err, &le) {
			t.Errorf("%s: Validate = %v, want an *InvalidLimitError", c.field, err)
			continue
		}
		if le.Type != "semantics.Limits" || le.Field != c.field || le.Value != c.value || le.Rule == "" {
			t.Errorf("%s: %#v, want Type semantics.Limits, Field %s, Value %v and a rule", c.field, le, c.field, c.value)
		}
	}

	err := (&semantics.Limits{CasRate: semantics.Rate{PerSecond: math.NaN()}}).Validate()
	var le *semantics.InvalidLimitError
	if !errors.As(err, &le) || le.Field != "CasRate.PerSecond" {
		t.Errorf("NaN CasRate: %v, want an *InvalidLimitError of CasRate.PerSecond", err)
	}
	err = (&semantics.Limits{MaxStreams: -1}).Validate()
	if want := "semantics.Limits.MaxStreams = -1: must not be negative (0: the default)"; err == nil || err.Error() != want {
		t.Errorf("Error() = %v, want %q", err, want)
	}

	if err := (semantics.Rate{}).Validate(); err != nil {
		t.Errorf("zero Rate: %v", err)
	}
	for _, c := range []struct {
		r     semantics.Rate
		field string
	}{{semantics.Rate{PerSecond: -0.5}, "PerSecond"}, {semantics.Rate{PerSecond: math.NaN()}, "PerSecond"}, {semantics.Rate{PerSecond: 1, Burst: -1}, "Burst"}} {
		err := c.r.Validate()
		if !errors.As(err, &le) || le.Type != "semantics.Rate" || le.Field != c.field {
			t.Errorf("Rate %+v: %v, want an *InvalidLimitError of semantics.Rate.%s", c.r, err, c.field)
		}
	}
}
