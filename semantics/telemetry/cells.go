package telemetry

import (
	"fmt"
	"sort"
	"strings"
)

// The cells of the health report's text tables, spelled as every operator
// table spells them (internal/tablefmt, which the commands use; semantics/
// imports nothing of internal/, so telemetry keeps these three here and
// TestCellsMatchTablefmt keeps the two spellings equal).

// byBackend formats per-backend counts for a table cell: " (quic=2,
// yamux=1)" in backend order, "" for none.
func byBackend(m map[string]int) string {
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

// yesNo formats a boolean table cell.
func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// dash formats a table cell that may be empty: "-" for "".
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
