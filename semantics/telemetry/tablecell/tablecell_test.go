package tablecell

import "testing"

func TestCells(t *testing.T) {
	if got := ByBackend(map[string]int{"yamux": 1, "quic": 2}); got != " (quic=2, yamux=1)" {
		t.Errorf("ByBackend = %q", got)
	}
	if got := ByBackend(nil); got != "" {
		t.Errorf("ByBackend(nil) = %q", got)
	}
	if YesNo(true) != "yes" || YesNo(false) != "no" {
		t.Error("YesNo")
	}
	if Dash("") != "-" || Dash("x") != "x" {
		t.Error("Dash")
	}
}
