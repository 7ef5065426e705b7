// Package doctor holds the findings format shared by `forgeyard transport
// doctor` (daemon side) and `forgeyard-agent doctor` (agent side): one
// line per check with OK, WARN or FAIL, plain words, and what to do.
package doctor

import (
	"encoding/json"
	"fmt"
	"forgeyard.dev/transport/semantics/telemetry/tablecell"
	"io"
	"strings"
	"text/tabwriter"
)

// Result is a check's outcome.
type Result string

// Results, in increasing severity.
const (
	OK   Result = "OK"
	Warn Result = "WARN"
	Fail Result = "FAIL"
	// Skip: the check could not run because an earlier one failed.
	Skip Result = "SKIP"
)

// Finding is one check's outcome.
type Finding struct {
	// Check names the check ("dns", "udp", "tls-trust", ...).
	Check string `json:"check"`
	// Target is what was checked (an endpoint, a file, a listener).
	Target string `json:"target,omitempty"`
	Result Result `json:"result"`
	// Detail says in plain words what was found.
	Detail string `json:"detail"`
	// Fix says what to do; empty for OK.
	Fix string `json:"fix,omitempty"`
}

// Report is a doctor run.
type Report struct {
	// Result is the worst result of the findings (SKIP counts as OK).
	Result   Result    `json:"result"`
	Findings []Finding `json:"findings"`
}

// Add appends f and updates Result.
func (r *Report) Add(f Finding) {
	r.Findings = append(r.Findings, f)
	if r.Result == "" {
		r.Result = OK
	}
	if rank(f.Result) > rank(r.Result) {
		r.Result = f.Result
	}
}

// Replace sets the i-th finding to f and recomputes Result (a later check
// may change what an earlier finding means, e.g. a blocked UDP path that
// the agent's healthy TCP relay makes a warning).
func (r *Report) Replace(i int, f Finding) {
	r.Findings[i] = f
	r.Result = OK
	for _, g := range r.Findings {
		if rank(g.Result) > rank(r.Result) {
			r.Result = g.Result
		}
	}
}

func rank(r Result) int {
	switch r {
	case Fail:
		return 2
	case Warn:
		return 1
	}
	return 0
}

// Failed reports whether a finding failed.
func (r *Report) Failed() bool { return r.Result == Fail }

// WriteText renders the report for a terminal: an aligned table, each
// non-OK finding followed by its fix, then a summary line.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "RESULT\tCHECK\tTARGET\tDETAIL\n")
	for _, f := range r.Findings {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Result, f.Check, tablecell.Dash(f.Target), oneLine(f.Detail))
		if f.Fix != "" {
			fmt.Fprintf(tw, "\t\t\t  fix: %s\n", oneLine(f.Fix))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var fails, warns int
	for _, f := range r.Findings {
		switch f.Result {
		case Fail:
			fails++
		case Warn:
			warns++
		}
	}
	res := r.Result
	if res == "" {
		res = OK
	}
	_, err := fmt.Fprintf(w, "\n%s: %d checks, %d failed, %d warnings\n", res, len(r.Findings), fails, warns)
	return err
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	if r.Result == "" {
		r.Result = OK
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Print writes the report to w as JSON when asJSON is set, else as text.
func (r *Report) Print(w io.Writer, asJSON bool) error {
	if asJSON {
		return r.WriteJSON(w)
	}
	return r.WriteText(w)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
