package config

import (
	"crypto/tls"
	"fmt"
	"slices"
	"strings"
)

// Key-exchange groups of the curves keys ([tls] curves of the daemon and
// the relay, control_plane.curves of the agent). Empty: Go's default, the
// post-quantum hybrid X25519MLKEM768 first, then X25519 and the NIST
// curves.
//
// CurvesX25519Only ("x25519") is the documented opt-in for fleets that
// value admission speed over post-quantum protection: a handshake without
// ML-KEM costs the agent its key generation and the server its
// encapsulation (docs/perf.md: about a third of a raw handshake's CPU).
// Set it on both sides: an agent that still offers the hybrid first makes
// a daemon restricted to X25519 pick the X25519 share it also sent (no
// extra round trip), but the agent has paid for its ML-KEM key already.
var curveNames = map[string]tls.CurveID{
	"x25519mlkem768": tls.X25519MLKEM768,
	"x25519":         tls.X25519,
	"p256":           tls.CurveP256,
	"p384":           tls.CurveP384,
	"p521":           tls.CurveP521,
}

// CurvesX25519Only is the curves value of the X25519-only opt-in.
var CurvesX25519Only = []string{"x25519"}

// ParseCurves turns a curves list into tls.Config.CurvePreferences (nil
// for an empty list: Go's default). key names the setting in errors.
func ParseCurves(key string, names []string) ([]tls.CurveID, error) {
	if len(names) == 0 {
		return nil, nil
	}
	out := make([]tls.CurveID, 0, len(names))
	for i, n := range names {
		id, ok := curveNames[strings.ToLower(strings.TrimSpace(n))]
		if !ok {
			known := make([]string, 0, len(curveNames))
			for k := range curveNames {
				known = append(known, k)
			}
			slices.Sort(known)
			return nil, invalid(fmt.Sprintf("%s[%d]", key, i), "unknown group %q (want one of %s; empty list: Go's default, the hybrid x25519mlkem768 first)", n, strings.Join(known, ", "))
		}
		if slices.Contains(out, id) {
			return nil, invalid(fmt.Sprintf("%s[%d]", key, i), "%q listed twice", n)
		}
		out = append(out, id)
	}
	return out, nil
}
