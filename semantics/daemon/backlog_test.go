package daemon

import (
	"strings"
	"testing"
)

// TestBacklogFull: at the measured rate, a backlog that would take longer
// than registrationQueueWait refuses; an unmeasured rate never does.
func TestBacklogFull(t *testing.T) {
	if err := backlogFull(10000, 0); err != nil {
		t.Fatalf("unmeasured: %v", err)
	}
	if err := backlogFull(399, 100); err != nil { // 3.99 s
		t.Fatalf("399 at 100/s: %v", err)
	}
	err := backlogFull(401, 100) // 4.01 s
	if err == nil || !strings.Contains(err.Error(), "awaiting registration at 100/s") {
		t.Fatalf("401 at 100/s: %v", err)
	}
}
