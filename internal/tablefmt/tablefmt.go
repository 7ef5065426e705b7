// Package tablefmt formats the cells of the operator tools' text tables
// (forgeyard transport, forgeyard-agent connection status, the doctors,
// the load generator's report), so every table spells counts, booleans and
// empty values the same way. semantics/telemetry's health report spells
// them identically with its own three helpers (semantics/ imports nothing
// of internal/; its TestCellsMatchTablefmt keeps the two equal).
package tablefmt

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
