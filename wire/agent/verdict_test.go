package agent

import "testing"

// RenewOutcomeV1 and ResyncDecisionV1 share verdict.go only while their
// variants keep the verdict numbering.
func TestVerdictNumbering(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uint32
	}{
		{"RenewExtended", uint32(RenewExtended), verdictKeep},
		{"RenewRevoked", uint32(RenewRevoked), verdictEnd},
		{"RenewUnknown", uint32(RenewUnknown), verdictNone},
		{"numRenewOutcomes", numRenewOutcomes, numVerdicts},
		{"DecisionContinue", uint32(DecisionContinue), verdictKeep},
		{"DecisionCancel", uint32(DecisionCancel), verdictEnd},
		{"DecisionStale", uint32(DecisionStale), verdictNone},
		{"numResyncDecisions", numResyncDecisions, numVerdicts},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, the verdict layout needs %d", c.name, c.got, c.want)
		}
	}
}
