// Package tablecell spells the cells of every operator text table the
// same way: per-backend counts, booleans and empty values. The health
// report of semantics/telemetry and the commands' tables (forgeyard
// transport, forgeyard-agent connection status, the doctors, the load
// generator's report) all use it. It imports only the standard library,
// so a command that prints a table does not link telemetry's exporters.
// Not part of the stable API (docs/api.md).
package tablecell

import (
	"fmt"
	"sort"
	"strings"
)

// ByBackend formats per-backend counts for a table cell: " (quic=2,
// yamux=1)" in backend order, "" for none. Every table shares it.
func ByBackend(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// YesNo formats a boolean table cell.
func YesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// Dash formats a table cell that may be empty: "-" for "".
func Dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
